"""The OmniVoice stages' logic in-process (no Triton) on the tiny checkpoint: the prompt's
segment plan, and the generator's batches: a first segment answered before the segments of
its stream that clone it are run, and a batch giving each segment what it gets alone."""
from __future__ import annotations

import numpy as np
import pytest

import tritontts.families.omnivoice.stages as stages
from tritontts.families.omnivoice.request import parse_omnivoice_params
from tritontts.protocol import CHUNK_INDEX, IS_FINAL, STREAM_ID
from tritontts.serving.stage import Inputs, StageContext

TWO = ("The birch canoe slid on the smooth planks of the old wooden dock. "
       "Glue the sheet to the dark blue background before the paint dries.")


@pytest.fixture(scope="module")
def prompt(checkpoint):
    return stages.OmniVoicePromptStage(StageContext("omnivoice_prompt", checkpoint.root), checkpoint)


@pytest.fixture(scope="module")
def generator(checkpoint):
    return stages.OmniVoiceGeneratorStage(StageContext("omnivoice_generator", checkpoint.root), checkpoint)


def segment_inputs(prompt, text, stream, seed=3, **params):
    out = []
    for index, item in enumerate(prompt.plan(text, parse_omnivoice_params({"num_steps": 4, **params}), seed)):
        inputs = Inputs({k: np.asarray(v) for k, v in item.items()})
        inputs[STREAM_ID], inputs[CHUNK_INDEX] = np.asarray([stream]), np.asarray([index])
        out.append(inputs)
    return out


def test_segments_are_sentences_and_short_ones_join_the_next():
    assert stages.segments("Hi. Yes. The birch canoe slid on the smooth planks of the dock.") == [
        "Hi. Yes. The birch canoe slid on the smooth planks of the dock."]
    assert len(stages.segments(TWO)) == 2


def test_later_segments_of_an_automatic_voice_hold_the_first_segments_place(prompt):
    first, second = prompt.plan(TWO, parse_omnivoice_params({}), 1)
    assert not first["from_first"] and second["from_first"]
    assert [first[IS_FINAL], second[IS_FINAL]] == [False, True]
    mask = prompt.checkpoint.config.audio_mask_id
    start = second["audio_start"]
    place = second["ids"][start:start + first["frames"]]
    assert (place == mask).all() and second["ids"].shape[0] == start + first["frames"] + second["frames"]


def test_speed_divides_every_segments_frames_and_the_pads_once(prompt):
    """A later segment paced like the first is paced like the first at speed 1, then
    divided: the speed is not compounded (it was: speed 0.5 made segment 2 four times as
    long). The pads and fades shrink with the speed too."""
    plain = [item["frames"] for item in prompt.plan(TWO, parse_omnivoice_params({}), 1)]
    for speed in (0.5, 2.0):
        sped = [item["frames"] for item in prompt.plan(TWO, parse_omnivoice_params({"speed": speed}), 1)]
        assert all(abs(f * speed - p) <= speed for f, p in zip(sped, plain)), (speed, plain, sped)
    audio = np.ones(24000, np.float32)
    assert stages.shape_output(audio, 0.0, 2.0).size == 24000 + 2 * int(stages.PAD_SECONDS / 2 * 24000)


def test_a_first_segment_is_answered_before_the_segments_that_clone_it_run(prompt, generator, monkeypatch):
    from tritontts.families.omnivoice import generator as model_code

    events, real = [], model_code.unmask

    def recording_unmask(model, jobs, cancelled=lambda: False):
        events.append(("run", len(jobs)))
        return real(model, jobs, cancelled)

    monkeypatch.setattr(model_code, "unmask", recording_unmask)   # the stage imports it per call
    batch = segment_inputs(prompt, TWO, stream=1)
    results = generator.run_batch(batch, lambda i, result: events.append(("ready", i)))
    assert events == [("run", 1), ("ready", 0), ("run", 1), ("ready", 1)]
    assert all(isinstance(r, dict) for r in results)


def test_a_batch_gives_each_segment_what_it_gets_alone(prompt, generator):
    a = segment_inputs(prompt, TWO, stream=10, seed=5)
    b = segment_inputs(prompt, "Rice is often served in round bowls.", stream=11, seed=6, language="en")
    together = generator.run_batch(a + b)
    alone = generator.run_batch(a) + generator.run_batch(b)
    for x, y in zip(together, alone):
        assert np.array_equal(x["codes"], y["codes"])
    # Every stream's kept first-segment codes are gone once its last segment ran.
    assert generator.first_codes.get(10) is None and generator.first_codes.get(11) is None


def test_a_segment_whose_first_segment_is_unknown_fails_alone(prompt, generator):
    later = segment_inputs(prompt, TWO, stream=12)[1]
    other = segment_inputs(prompt, "Rice is often served in round bowls.", stream=13)[0]
    failed, fine = generator.run_batch([later, other])
    assert isinstance(failed, RuntimeError) and "first segment" in str(failed)
    assert isinstance(fine, dict)


def test_the_decoder_decodes_a_batch_of_mixed_lengths_as_each_alone_and_fails_only_the_bad_one(checkpoint):
    """Segments of two lengths from several streams, with and without a reference's
    loudness, in one batch: each equals its segment decoded alone within 1e-5; malformed
    codes beside them fail alone with what to fix."""
    from tritontts.protocol import InvalidRequest

    decoder = stages.OmniVoiceDecoderStage(StageContext("omnivoice_decoder", checkpoint.root), checkpoint)
    rng = np.random.default_rng(0)
    size = decoder.decoder.cfg.codebook_size

    def segment(frames, ref_rms=0.0, speed=1.0, width=8):
        return Inputs(codes=rng.integers(0, size, (frames, width)).astype(np.int32),
                      ref_rms=np.array([ref_rms], np.float32), speed=np.array([speed], np.float32))

    batch = [segment(6), segment(11, ref_rms=0.05), segment(6, speed=1.5), segment(6, width=3),
             segment(11), segment(6, ref_rms=0.02)]
    together = decoder.run_batch(batch)
    assert isinstance(together[3], InvalidRequest) and "[frames, 8]" in str(together[3])
    for i, result in enumerate(together):
        if i == 3:
            continue
        alone = decoder.run(batch[i])["audio"]
        assert result["audio"].shape == alone.shape and np.abs(alone).max() > 0
        assert np.abs(result["audio"] - alone).max() <= 1e-5, i
    # the control: two different segments of one length decode differently
    assert np.abs(together[0]["audio"][:4000] - together[5]["audio"][:4000]).max() > 1e-4
