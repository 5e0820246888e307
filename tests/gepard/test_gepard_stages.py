"""Gepard-1.0's prompt and codec stages on their own (no server): the prompt stage lays out
the ids with the request's frame budget and refuses what it cannot voice; the codec stage
takes chunks as the talker sends them (10, then 86 frames after up to 25 frames of left
context) from two streams in Triton-like batches and gives each stream exactly its whole
decode; a bad window is a 400."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tritontts.serving.stage import Inputs, StageContext
from tritontts.protocol import InvalidRequest


@pytest.fixture(scope="module")
def codec_stage(checkpoint):
    from tritontts.families.gepard.stages import GepardCodecStage

    return GepardCodecStage(StageContext("gepard_codec", checkpoint.root), checkpoint)


def request(text: str, voice: str = "default", **params) -> Inputs:
    return Inputs(text=np.array([text.encode()], object), voice=np.array([voice.encode()], object),
                  params=np.array([json.dumps(params).encode()], object))


def test_prompt_stage_lays_out_the_ids_with_the_frame_budget_and_seed(checkpoint):
    from tritontts.families.gepard.prompt import GepardPromptBuilder
    from tritontts.families.gepard.stages import GepardPromptStage

    stage = GepardPromptStage(StageContext("gepard_prompt", checkpoint.root), checkpoint)
    out = stage.run(request("Hello there.", max_new_tokens=33, seed=7))
    assert out["ids"].tolist() == GepardPromptBuilder(checkpoint.root, checkpoint.config)("Hello there.")
    assert int(out["max_frames"]) == 33 and int(out["seed"]) == 7
    assert int(stage.run(request("Hello there."))["max_frames"]) == 1000
    for bad, needle in ((request("Hello.", voice="alice"), "unknown voice"),
                        (request("Hello.", ref_text="hi"), "does not clone"),
                        (request("Hello.", max_new_tokens=0), "max_new_tokens")):
        with pytest.raises(InvalidRequest, match=needle):
            stage.run(bad)


def chunks(codes: np.ndarray, stream: int) -> list[Inputs]:
    """The talker's chunks of one utterance [frames, 32]: 10, then 86 frames each."""
    out, start, size = [], 0, 10
    while start < codes.shape[0]:
        end = min(start + size, codes.shape[0])
        first = max(0, start - 25)
        out.append(Inputs(codes=codes[first:end].astype(np.int32), left_context=np.array([start - first], np.int32),
                          stream_id=np.array([stream], np.int64), is_final=np.array([end == codes.shape[0]])))
        start, size = end, 86
    return out


def test_interleaved_streams_each_equal_their_whole_decode(codec_stage, checkpoint):
    import torch

    gen = np.random.default_rng(0)
    levels = np.array(checkpoint.config.head_levels)
    utterances = {7: gen.integers(0, levels, (120, 32)), 8: gen.integers(0, levels, (30, 32))}
    plans = {sid: chunks(codes, sid) for sid, codes in utterances.items()}
    batches = [[plans[7][0], plans[8][0]], [plans[7][1], plans[8][1]], [*plans[7][2:], *plans[8][2:]]]
    audio = {7: [], 8: []}
    for batch in batches:
        for inputs, result in zip(batch, codec_stage.run_batch(batch)):
            assert not isinstance(result, Exception), result
            assert result["sample_rate"] == 22050
            audio[int(inputs.scalar("stream_id"))].append(result["audio"])
    for sid, codes in utterances.items():
        got = np.concatenate(audio[sid])
        whole = codec_stage.codec.decode_codes(torch.from_numpy(codes.T[None].astype(np.int64)))[0].numpy()
        diff = float(np.abs(got - whole).max()) if got.shape == whole.shape else float("inf")
        print(f"stream {sid}: {codes.shape[0]} frames in {len(plans[sid])} chunks; vs whole decode {diff:.1e}")
        assert diff < 1e-5


@pytest.mark.parametrize("codes,needle", [
    (np.zeros((4, 31), np.int32), r"\[frames, 32\]"),
    (np.full((4, 32), 8, np.int32), "outside"),
    (np.full((4, 32), -1, np.int32), "outside"),
])
def test_a_bad_window_is_a_400_and_the_others_in_its_batch_decode(codec_stage, codes, needle):
    good = Inputs(codes=np.zeros((4, 32), np.int32), left_context=np.array([0], np.int32))
    bad = Inputs(codes=codes, left_context=np.array([0], np.int32))
    bad_result, good_result = codec_stage.run_batch([bad, good])
    assert isinstance(bad_result, InvalidRequest) and __import__("re").search(needle, str(bad_result))
    assert good_result["audio"].shape == (4 * 1024,)


def test_the_final_chunk_of_a_stream_that_ended_at_its_first_frame_decodes_to_no_audio(codec_stage, checkpoint):
    """The talker's first frame was the end: it sends one zero frame, all context
    (FrameChunkTalkerStage.chunk), and the response is valid and empty."""
    (result,) = codec_stage.run_batch([Inputs(codes=np.zeros((1, codec_stage.levels.shape[0]), np.int32),
                                              left_context=np.array([1], np.int32), first_frame=np.array([0], np.int32))])
    assert not isinstance(result, Exception) and result["audio"].size == 0
