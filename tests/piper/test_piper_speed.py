"""Piper's speed on the real default voice: the speed-1 alignment rescaled in the graph
(tritontts/families/piper/vits.py make_speed_exact)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tritontts.families.piper.phonemize import PiperPhonemizer
from tritontts.families.piper.request import parse_piper_params, scales_for
from tritontts.families.piper.vits import NOISE_INPUT, PiperVits, make_seedable, noise_length
from tritontts.families.piper.voices import load_voice_table

TEXT = "The birch canoe slid on the smooth planks. Glue the sheet to the dark blue background."


@pytest.fixture(scope="module")
def voice():
    spec = load_voice_table().resolve("default")
    return spec, PiperPhonemizer(spec.config), PiperVits(spec.model_path, spec.config.sample_rate, 1, 1)


def sentences(voice, speed=1.0):
    spec, phonemizer, _ = voice
    return list(phonemizer.sentence_phoneme_ids(TEXT)), scales_for(parse_piper_params({"speed": speed}), spec.config)


def test_speed_rescales_the_duration_by_its_factor_to_a_frame(voice):
    spec, _, vits = voice
    ids, scales = sentences(voice)
    plain = [vits.synthesize(s, scales, [11, i]).size for i, s in enumerate(ids)]
    for speed in (0.25, 0.5, 2.0, 4.0):
        _, at_speed = sentences(voice, speed)
        got = [vits.synthesize(s, at_speed, [11, i], speed=speed).size for i, s in enumerate(ids)]
        for n, m in zip(plain, got):
            # 256 samples a frame: the rounding of the rescaled total, at most one frame
            assert abs(m - n / speed) <= 256, (speed, n, m)


def test_speed_1_is_the_voices_own_synthesis_bit_for_bit(voice):
    """The rescaling passes speed 1's integer frames through: the same samples as the
    graph without it (seeded noise only)."""
    spec, _, vits = voice
    ids, scales = sentences(voice)
    model = onnx.load(str(spec.model_path))
    count = make_seedable(model)
    plain = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for i, s in enumerate(ids):
        rng = np.random.default_rng([11, i])
        size = noise_length(len(s), scales[1])
        feeds = {"input": np.asarray(s, np.int64)[None], "input_lengths": np.array([len(s)], np.int64),
                 "scales": np.asarray(scales, np.float32)}
        feeds.update({NOISE_INPUT.format(k): rng.standard_normal(size, dtype=np.float32) for k in range(count)})
        theirs = plain.run(None, feeds)[0].reshape(-1)
        ours = vits.synthesize(s, scales, [11, i])
        assert ours.size == theirs.size
        np.testing.assert_allclose(ours, np.clip(theirs / np.abs(theirs).max(), -1, 1), atol=1e-5)


def test_dividing_the_length_scale_misses_the_factor_the_negative_control(voice):
    """piper-tts's way (length scale / speed, every phoneme rounded up to a frame, the
    rescaling left at 1) keeps the one-frame blanks: speed 2 lasts well over half as long."""
    spec, _, vits = voice
    ids, scales = sentences(voice)
    _, divided = sentences(voice, 2.0)
    plain = sum(vits.synthesize(s, scales, [11, i]).size for i, s in enumerate(ids))
    fast = sum(vits.synthesize(s, divided, [11, i]).size for i, s in enumerate(ids))
    print(f"length scale / 2: {fast * 2 / plain:.3f} of the expected duration")
    assert fast * 2 / plain > 1.1
