"""Fish Speech S2 Pro's codec stage on its own (no server): chunks as the talker sends them
(windows of 4, then 25 frames, after up to 25 frames of left context), two streams
interleaved in Triton-like batches (one batch holding two chunks of the same stream), give
each stream exactly its whole decode; a chunk whose stream has no state decodes its window's
context again (the approximate fallback); a bad window is a 400."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tritontts.families.fish_s2_pro.checkpoint import open_checkpoint
from tritontts.families.fish_s2_pro.random_checkpoint import write_random_checkpoint
from tritontts.serving.stage import Inputs, StageContext
from tritontts.protocol import InvalidRequest


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    from tritontts.families.fish_s2_pro.stages import FishS2ProCodecStage

    checkpoint = open_checkpoint(write_random_checkpoint(tmp_path_factory.mktemp("fish") / "tiny", seed=3))
    return FishS2ProCodecStage(StageContext("fish_s2_pro_codec", checkpoint.root), checkpoint)


def chunks(codes: np.ndarray, stream: int) -> list[Inputs]:
    """The talker's chunks of one utterance [frames, 10]: 4, then 25 frames each."""
    out, start, size = [], 0, 4
    while start < codes.shape[0]:
        end = min(start + size, codes.shape[0])
        first = max(0, start - 25)
        out.append(Inputs(codes=codes[first:end].astype(np.int32), left_context=np.array([start - first], np.int32),
                          first_frame=np.array([first], np.int32), stream_id=np.array([stream], np.int64),
                          is_final=np.array([end == codes.shape[0]])))
        start, size = end, 25
    return out


def test_interleaved_streams_each_equal_their_whole_decode(stage):
    gen = np.random.default_rng(0)
    utterances = {7: gen.integers(0, 16, (70, 10)), 8: gen.integers(0, 16, (58, 10))}
    plans = {sid: chunks(codes, sid) for sid, codes in utterances.items()}
    # Batches as Triton might form them: both streams' first chunks; stream 7's next two
    # together (in order) with stream 8's second; then the rest.
    batches = [[plans[7][0], plans[8][0]], [plans[7][1], plans[8][1], plans[7][2]], [*plans[8][2:], *plans[7][3:]]]
    audio = {7: [], 8: []}
    for batch in batches:
        for inputs, result in zip(batch, stage.run_batch(batch)):
            assert not isinstance(result, Exception), result
            audio[int(inputs.scalar("stream_id"))].append(result["audio"])
    for sid, codes in utterances.items():
        got = np.concatenate(audio[sid])
        with torch.no_grad():
            whole = stage.codec.decode(torch.from_numpy(codes.T[None]))[0, 0].numpy()
        diff = float(np.abs(got - whole).max()) if got.shape == whole.shape else float("inf")
        print(f"stream {sid}: {codes.shape[0]} frames in {len(plans[sid])} chunks; vs whole decode {diff:.1e}")
        assert diff < 1e-5
    assert len(stage.streams.items) == 0      # final chunks dropped their states


def test_a_chunk_without_its_streams_state_decodes_its_window_again(stage):
    codes = np.random.default_rng(1).integers(0, 16, (60, 10))
    later = chunks(codes, 9)[2]               # frames 29..54 after 25 of context, no state
    (result,) = stage.run_batch([later])
    with torch.no_grad():
        window = stage.codec.decode_window(torch.from_numpy(codes[4:54].T[None]), 25, first_frame=4)[0, 0].numpy()
    assert result["audio"].shape == window.shape and float(np.abs(result["audio"] - window).max()) < 1e-5
    stage.streams.pop(9)


def test_a_window_of_the_wrong_shape_is_a_400(stage):
    (result,) = stage.run_batch([Inputs(codes=np.zeros((5, 3), np.int32), left_context=np.array([0], np.int32),
                                        first_frame=np.array([0], np.int32), stream_id=np.array([1], np.int64),
                                        is_final=np.array([True]))])
    assert isinstance(result, InvalidRequest) and "[frames, 10]" in str(result)


def test_a_stream_ending_on_a_chunk_boundary_gets_an_empty_final_chunk_and_its_state_goes(stage):
    """A talker that stops exactly at a chunk boundary (4, 29, ... frames) sends a final
    chunk with nothing new: its window is all left context (FrameChunkTalkerStage.chunk:
    frames 4..29 with left_context 25). With the stream's state that left 0 frames to
    decode, and the request failed with a 500 ("padded input size per channel: (0)")."""
    codes = np.random.default_rng(2).integers(0, 16, (29, 10))
    plan = chunks(codes, 11)
    assert len(plan) == 2 and bool(plan[-1].scalar("is_final"))
    plan[-1]["is_final"] = np.array([False])             # the talker had not ended yet ...
    empty = Inputs(codes=codes[4:29].astype(np.int32), left_context=np.array([25], np.int32),
                   first_frame=np.array([4], np.int32), stream_id=np.array([11], np.int64),
                   is_final=np.array([True]))             # ... and ends on the boundary
    audio = []
    for batch in ([plan[0]], [plan[1], empty]):
        for result in stage.run_batch(batch):
            assert not isinstance(result, Exception), result
            audio.append(result["audio"])
    assert audio[-1].size == 0 and 11 not in dict(stage.streams.items)
    with torch.no_grad():
        whole = stage.codec.decode(torch.from_numpy(codes.T[None]))[0, 0].numpy()
    assert float(np.abs(np.concatenate(audio) - whole).max()) < 1e-5
    # Alone (no state for its stream: another instance, an evicted stream) it is empty too.
    (result,) = stage.run_batch([empty])
    assert not isinstance(result, Exception) and result["audio"].size == 0
    # A stream whose first frame was the end: one zero frame, all context, a new stream.
    first = Inputs(codes=np.zeros((1, 10), np.int32), left_context=np.array([1], np.int32),
                   first_frame=np.array([0], np.int32), stream_id=np.array([12], np.int64),
                   is_final=np.array([True]))
    (result,) = stage.run_batch([first])
    assert not isinstance(result, Exception) and result["audio"].size == 0 and 12 not in dict(stage.streams.items)
