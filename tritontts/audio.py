"""Audio helpers shared by stages: decode uploaded audio, resample."""
from __future__ import annotations

import io

import numpy as np

from .protocol import InvalidRequest


def decode_audio(data: bytes, what: str = "audio") -> tuple[np.ndarray, int]:
    """Any container/codec ffmpeg knows (wav, flac, mp3, ogg, ...) -> (mono float32, rate)."""
    import av

    if not data:
        raise InvalidRequest(f"{what} is empty")
    try:
        with av.open(io.BytesIO(data)) as container:
            if not container.streams.audio:
                raise InvalidRequest(f"{what} has no audio stream")
            stream = container.streams.audio[0]
            resampler = av.AudioResampler(format="flt", layout="mono", rate=stream.rate)
            pieces = [frame.to_ndarray().reshape(-1)
                      for decoded in container.decode(stream)
                      for frame in resampler.resample(decoded)]
            pieces += [frame.to_ndarray().reshape(-1) for frame in resampler.resample(None)]
            rate = stream.rate
    except InvalidRequest:
        raise
    except Exception as exc:  # noqa: BLE001 - anything ffmpeg rejects is the client's file
        raise InvalidRequest(f"{what} could not be decoded ({type(exc).__name__}: {exc}); "
                             "send wav, flac, mp3 or ogg") from None
    audio = np.concatenate(pieces).astype(np.float32) if pieces else np.zeros(0, np.float32)
    if audio.size == 0 or not rate:
        raise InvalidRequest(f"{what} contains no samples")
    return audio, int(rate)


def resample(audio: np.ndarray, rate: int, target: int) -> np.ndarray:
    import soxr

    if rate == target:
        return audio.astype(np.float32, copy=False)
    return soxr.resample(audio, rate, target, quality="HQ").astype(np.float32)


def reference_recording(data: bytes, rate: int, min_seconds: float = 1.0,
                        max_seconds: float = 30.0, what: str = "ref_audio") -> np.ndarray:
    """An uploaded voice reference: decoded, its length checked, resampled to `rate`, and
    refused when silent (a clear 400 for each)."""
    audio, source_rate = decode_audio(data, what)
    seconds = audio.size / source_rate
    if not min_seconds <= seconds <= max_seconds:
        raise InvalidRequest(f"{what} is {seconds:.1f} s; it must be between "
                             f"{min_seconds:g} and {max_seconds:g} s")
    audio = resample(audio, source_rate, rate).astype(np.float32)
    if float(np.abs(audio).max(initial=0.0)) < 1e-4:
        raise InvalidRequest(f"{what} is silent")
    return audio
