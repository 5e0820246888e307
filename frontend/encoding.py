"""Float32 audio chunks -> bytes of the requested response_format, incrementally.

Every format is produced chunk by chunk, so streaming and non-streaming share one path:
wav (a streamed WAV header carries 0xFFFFFFFF sizes, as OpenAI's does), raw 16-bit PCM,
and flac/mp3/opus/aac through PyAV (its wheel carries libmp3lame, libopus and aac).
`speed` for a family without duration control is a time-stretch here (TimeStretch).
"""
from __future__ import annotations

import io
import struct

import numpy as np

FORMATS = ("wav", "pcm", "flac", "mp3", "opus", "aac")
CONTENT_TYPES = {
    "wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac",
    "mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac",
}
# PyAV container format, codec, and a sample rate the codec accepts (None: keep).
_AV = {
    "flac": ("flac", "flac", None),
    "mp3": ("mp3", "libmp3lame", None),
    "opus": ("ogg", "libopus", 48000),
    "aac": ("adts", "aac", None),
}


def to_pcm16(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def wav_header(sample_rate: int, num_samples: int | None) -> bytes:
    """44-byte PCM16 mono header; num_samples=None marks an unknown (streamed) length."""
    data = 0xFFFFFFFF if num_samples is None else num_samples * 2
    riff = 0xFFFFFFFF if num_samples is None else 36 + data
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVEfmt "
            + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
            + b"data" + struct.pack("<I", data))


class _Sink(io.RawIOBase):
    """A write-only file PyAV muxes into; drain() hands out what was written so far."""

    def __init__(self):
        self._buf = bytearray()

    def writable(self):
        return True

    def write(self, b):
        self._buf += b
        return len(b)

    def drain(self) -> bytes:
        out, self._buf = bytes(self._buf), bytearray()
        return out


# Formats whose stream cannot be empty and still decode (mp3 and ADTS AAC are frames only;
# an Ogg Opus stream without an audio page ends before its first sample): a response with
# no audio carries 20 ms of silence in them. wav and flac are a header, pcm nothing.
SILENT_WHEN_EMPTY = ("mp3", "aac", "opus")


class TimeStretch:
    """Audio played `speed` times faster at the same pitch, chunk by chunk: ffmpeg's atempo
    filter (WSOLA, through PyAV, which the encoder already needs; no other binary). One
    filter per response, so chunk borders leave no seams. atempo takes 0.5..2 per instance
    here: 0.25..4 is a chain of them."""

    def __init__(self, sample_rate: int, speed: float):
        import av

        if not 0.25 <= speed <= 4.0:
            raise ValueError(f"speed must be within 0.25..4.0, got {speed}")
        self.sample_rate, self._pts, self._av = sample_rate, 0, av
        factors, rest = [], speed
        while rest < 0.5 or rest > 2.0:
            factors.append(0.5 if rest < 0.5 else 2.0)
            rest /= factors[-1]
        factors.append(rest)
        self._graph = av.filter.Graph()
        nodes = [self._graph.add_abuffer(format="flt", sample_rate=sample_rate, layout="mono")]
        nodes += [self._graph.add("atempo", f"{f:.6f}") for f in factors] + [self._graph.add("abuffersink")]
        for a, b in zip(nodes, nodes[1:]):
            a.link_to(b)
        self._graph.configure()

    def stretch(self, audio: np.ndarray, last: bool = False) -> np.ndarray:
        """The stretched audio that is ready; `last` flushes what the filter holds."""
        if len(audio):
            frame = self._av.AudioFrame.from_ndarray(np.asarray(audio, np.float32).reshape(1, -1),
                                                     format="flt", layout="mono")
            frame.sample_rate, frame.pts = self.sample_rate, self._pts
            self._pts += frame.samples
            self._graph.push(frame)
        if last:
            self._graph.push(None)
        out = []
        while True:
            try:
                out.append(self._graph.pull().to_ndarray().reshape(-1))
            except (BlockingIOError, EOFError):
                break
        return np.concatenate(out).astype(np.float32) if out else np.zeros(0, np.float32)


class AudioEncoder:
    """encode(chunk) -> bytes ready to send; finish() -> the trailing bytes. With
    output_rate, chunks are resampled on the way (soxr's streaming resampler, so chunk
    borders leave no seams)."""

    def __init__(self, fmt: str, sample_rate: int, streaming: bool, output_rate: int | None = None,
                 speed: float = 1.0):
        if fmt not in FORMATS:
            raise ValueError(f"unknown format {fmt!r}")
        self._stretch = TimeStretch(sample_rate, speed) if speed != 1.0 else None
        self.samples = 0        # audio samples encoded, after the stretch (at the model's rate)
        self.model_rate = sample_rate
        self._resample = None
        if output_rate is not None and output_rate != sample_rate:
            import soxr

            self._resample = soxr.ResampleStream(sample_rate, output_rate, 1, dtype="float32",
                                                 quality="HQ")
            sample_rate = output_rate
        self.format, self.sample_rate, self.streaming = fmt, sample_rate, streaming
        self._started = False
        self._pcm: list[bytes] = []  # non-streaming wav needs the length first
        self._av = None
        if fmt in _AV:
            self._open_av()

    def _open_av(self):
        import av

        container_fmt, codec, rate = _AV[self.format]
        self._sink = _Sink()
        # Ogg buffers a page per second by default: flush pages per chunk instead.
        options = {"page_duration": "20000", "flush_packets": "1"} if container_fmt == "ogg" else {}
        self._container = av.open(self._sink, mode="w", format=container_fmt, options=options)
        self._stream = self._container.add_stream(codec, rate=rate or self.sample_rate)
        self._stream.layout = "mono"
        if self.format in ("mp3", "aac"):
            self._stream.bit_rate = 64000
        self._resampler = av.AudioResampler(
            format=self._stream.codec_context.codec.audio_formats[0].name,
            layout="mono", rate=rate or self.sample_rate)
        self._av = av
        self._pts = 0

    @property
    def content_type(self) -> str:
        return CONTENT_TYPES[self.format]

    @property
    def seconds(self) -> float:
        """The audio's duration as the client hears it (after `speed`)."""
        return self.samples / self.model_rate

    def encode(self, audio: np.ndarray, last: bool = False) -> bytes:
        if self._stretch is not None:
            audio = self._stretch.stretch(audio, last=last)
        self.samples += len(audio)
        if self._resample is not None:
            audio = self._resample.resample_chunk(np.asarray(audio, np.float32), last=last)
        if self.format == "pcm":
            return to_pcm16(audio)
        if self.format == "wav":
            if not self.streaming:
                self._pcm.append(to_pcm16(audio))
                return b""
            head = b"" if self._started else wav_header(self.sample_rate, None)
            self._started = True
            return head + to_pcm16(audio)
        return self._mux(audio)

    def _mux(self, audio: np.ndarray) -> bytes:
        """Audio at the output rate through PyAV's encoder and muxer: the bytes ready."""
        if not len(audio):
            return b""
        frame = self._av.AudioFrame.from_ndarray(
            np.asarray(audio, dtype=np.float32).reshape(1, -1), format="flt", layout="mono")
        frame.sample_rate = self.sample_rate
        frame.pts = self._pts
        self._pts += frame.samples
        for resampled in self._resampler.resample(frame):
            for packet in self._stream.encode(resampled):
                self._container.mux(packet)
        return self._sink.drain()

    def finish(self) -> bytes:
        # What the stretch and the resampler still hold (their filter delay) comes out first.
        last = self._stretch is not None or self._resample is not None
        flushed = self.encode(np.zeros(0, np.float32), last=True) if last else b""
        self._stretch = self._resample = None
        return flushed + self._finish()

    def _finish(self) -> bytes:
        if self.format == "pcm":
            return b""
        if self.format == "wav":
            if self.streaming:
                return b"" if self._started else wav_header(self.sample_rate, None)
            pcm = b"".join(self._pcm)
            return wav_header(self.sample_rate, len(pcm) // 2) + pcm
        if self._pts == 0 and self.format in SILENT_WHEN_EMPTY:
            # No audio at all (the talker ended at its first frame): these formats have no
            # decodable empty stream, so the body is their smallest, one frame of silence.
            self._mux(np.zeros(self.sample_rate // 50, np.float32))
        for resampled in self._resampler.resample(None):
            for packet in self._stream.encode(resampled):
                self._container.mux(packet)
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()
        return self._sink.drain()
