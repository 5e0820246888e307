"""Prometheus metrics of the front (served at /metrics)."""
from prometheus_client import Counter, Gauge, Histogram

REQUESTS = Counter("tts_requests_total", "Speech requests by family and HTTP status",
                   ["model", "status"])
TIME_TO_FIRST_AUDIO = Histogram(
    "tts_time_to_first_audio_seconds", "From request arrival to the first audio chunk",
    ["model"], buckets=(0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30))
AUDIO_SECONDS = Counter("tts_audio_seconds_total", "Seconds of audio produced", ["model"])
IN_FLIGHT = Gauge("tts_requests_in_flight", "Speech requests being served")
