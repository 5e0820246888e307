"""Decoding what the front serves, for checks."""
from __future__ import annotations

import io

import numpy as np

HARVARD = [
    "The birch canoe slid on the smooth planks.",
    "Glue the sheet to the dark blue background.",
    "It's easy to tell the depth of a well.",
    "These days a chicken leg is a rare dish.",
    "Rice is often served in round bowls.",
    "The juice of lemons makes fine punch.",
    "The box was thrown beside the parked truck.",
    "The hogs were fed chopped corn and garbage.",
    "Four hours of steady work faced us.",
    "A large size in stockings is hard to sell.",
]


def decode(data: bytes) -> tuple[np.ndarray, int]:
    """Any served format -> (float32 mono samples, sample rate), through PyAV/ffmpeg."""
    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        assert stream.channels == 1, "served audio is mono"
        frames = []
        for frame in container.decode(stream):
            samples = frame.to_ndarray().reshape(-1)
            if samples.dtype.kind == "i":  # s16 / s32 sample formats
                samples = samples / float(np.iinfo(samples.dtype).max)
            frames.append(samples.astype(np.float32))
        rate = stream.rate
    audio = np.concatenate(frames) if frames else np.zeros(0, np.float32)
    return audio, rate


def pcm16(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def rms(audio: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(audio)))) if audio.size else 0.0
