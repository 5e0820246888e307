"""What end-to-end tests of several families check the same way through the front."""
from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Callable

import numpy as np

from .audio import pcm16


@contextmanager
def uploaded_voice(http, name: str, ref: dict[str, str]):
    """A voice stored with POST /v1/audio/voices from `ref` (ref_audio base64, ref_text),
    deleted afterwards."""
    r = http.post("/v1/audio/voices", data={"name": name, "consent": "test", "ref_text": ref["ref_text"]},
                  files={"audio_sample": ("ref.wav", base64.b64decode(ref["ref_audio"]), "audio/wav")})
    assert r.status_code == 200, r.text
    try:
        yield
    finally:
        http.delete(f"/v1/audio/voices/{name}")


def assert_concurrent_equal_solo(speak: Callable[..., Any], bodies: list[dict], tolerance: float = 1e-3) -> None:
    """Each request body spoken alone, then all at once: the same PCM (batched with others,
    the engine's products block differently: equal up to rounding)."""
    solo = [speak(**b).content for b in bodies]
    with ThreadPoolExecutor(len(bodies)) as pool:
        together = list(pool.map(lambda b: speak(**b), bodies))
    for alone, r in zip(solo, together):
        assert r.status_code == 200, r.text
        a, b = pcm16(alone), pcm16(r.content)
        assert a.size == b.size and float(np.abs(a - b).max()) <= tolerance
