"""The higgs-audio v2 talker stage's chunk plan and the decoder stage, without Triton or
vLLM: the talker stage driven by a stand-in engine that publishes steps as the model does
(a stream that ends with the stream-end cascade, and one cut by max_new_tokens), and the
decoder stage decoding those chunks (batched) back to exactly the whole utterance."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from tritontts.families.higgs_audio_v2.talker import audio_frames, frame_codes
from tritontts.protocol import IS_FINAL
from tritontts.serving.stage import Inputs, StageContext


def random_steps(n: int, end: bool, seed: int = 0) -> list[torch.Tensor]:
    """n steps as the model makes them: all-bos first, codebook k held at bos for k + 1
    steps; with `end`, the last 9 steps the end cascade (codebook k at eos from k + 1 on)."""
    g = torch.Generator().manual_seed(seed)
    steps = torch.randint(0, 1024, (n, 8), generator=g)
    for k in range(8):
        steps[:k + 1, k] = 1024
        if end:
            steps[n - 8 + k:, k] = 1025
    if end:
        steps[n - 9, 0] = 1025       # the first end, sampled in codebook 0
    return list(steps)


class StandInEngine:
    """Publishes one step per engine output on the request's stream, like the model."""

    def __init__(self, steps, eos: int):
        self.steps, self.eos = steps, eos

    async def generate(self, prompt_ids, params, key, cancelled):
        from tritontts.engine.vllm_frames import lookup

        stream = lookup(key)
        tokens = []
        for i, step in enumerate(self.steps[:params.max_tokens]):
            stream.steps.append(step)
            ended = bool((step == 1025).all())
            tokens.append(self.eos if ended else 7)
            yield list(tokens)
            if ended:
                return


def talker_stage(checkpoint, steps):
    from tritontts.families.higgs_audio_v2.stages import (
        HiggsAudioV2TalkerStage, codec_context_frames)

    stage = object.__new__(HiggsAudioV2TalkerStage)      # no engine: the stand-in replaces it
    stage.checkpoint, stage.max_model_len, stage.max_frames = checkpoint, 2048, 1500
    stage.chunk_frames, stage.first_chunk_frames, stage.chunk_growth = 25, 5, 2
    stage.context_frames = codec_context_frames(checkpoint)
    stage.generate = StandInEngine(steps, checkpoint.config.eos_token_id).generate
    return stage


def run_talker(stage, max_frames: int = 0) -> list[dict]:
    inputs = Inputs(prompt_ids=np.arange(5, dtype=np.int32), ref_steps=np.zeros((1, 8), np.int32),
                    ref_step_count=np.array([0]), max_frames=np.array([max_frames]),
                    first_chunk_frames=np.array([0]), seed=np.array([1]), sampling=np.array([b""]),
                    stream_id=np.array([42]))

    async def collect():
        return [chunk async for chunk in stage.run(inputs)]

    return asyncio.run(collect())


@pytest.mark.parametrize("n,end,max_frames,sizes", [
    (60, True, 0, [5, 10, 20, 16]),       # 51 frames: the last chunk what is left
    (30, True, 0, [5, 10, 6]),            # 21 frames: the 10 waits for context, then the end
    (48, False, 40, [5, 10, 20, 5]),      # cut by max_new_tokens: 48 steps hold 40 frames
])
def test_chunks_cover_every_frame_once_with_codec_context_and_only_the_last_is_final(checkpoint, n, end, max_frames, sizes):
    steps = random_steps(n, end)
    chunks = run_talker(talker_stage(checkpoint, steps), max_frames)
    total = audio_frames(torch.stack(steps), checkpoint.config, finished=True)
    assert [c["codes"].shape[0] - c["left_context"] - c["right_context"] for c in chunks] == sizes
    assert sum(sizes) == total
    assert [c[IS_FINAL] for c in chunks] == [False] * (len(chunks) - 1) + [True]
    everything = frame_codes(torch.stack(steps), checkpoint.config, 0, total).numpy()
    start = 0
    for c, size in zip(chunks, sizes):
        lo = start - c["left_context"]
        assert c["left_context"] == min(start, 10) and c["right_context"] == min(total - start - size, 10)
        assert np.array_equal(c["codes"], everything[lo:lo + c["codes"].shape[0]])
        start += size


def test_decoder_stage_turns_the_chunks_into_the_whole_utterance_decoded_at_once(checkpoint):
    from tritontts.families.higgs_audio_v2.stages import HiggsAudioV2DecoderStage
    from tritontts.nn.higgs_codec import load_codec_decoder

    steps = random_steps(60, True, seed=3)
    chunks = run_talker(talker_stage(checkpoint, steps))
    decoder = HiggsAudioV2DecoderStage(StageContext("higgs_audio_v2_decoder", checkpoint.root), checkpoint)
    batch = [Inputs(codes=c["codes"], left_context=np.array([c["left_context"]]),
                    right_context=np.array([c["right_context"]])) for c in chunks]
    results = decoder.run_batch(batch)
    streamed = np.concatenate([r["audio"] for r in results])
    total = audio_frames(torch.stack(steps), checkpoint.config, finished=True)
    with torch.no_grad():
        whole = load_codec_decoder(checkpoint.codec_dir)(
            frame_codes(torch.stack(steps), checkpoint.config, 0, total).T[None])[0].clamp(-1, 1).numpy()
    diff = float(np.abs(streamed - whole).max())
    print(f"{len(chunks)} chunks vs the whole decode: max-abs-diff {diff:.2e}")
    assert streamed.shape == whole.shape and diff <= 1e-5
    # Control: the same chunks without their right context are not the whole decode.
    cut = [Inputs(codes=c["codes"][:c["codes"].shape[0] - c["right_context"]],
                  left_context=np.array([c["left_context"]]), right_context=np.array([0])) for c in chunks]
    assert float(np.abs(np.concatenate([r["audio"] for r in decoder.run_batch(cut)]) - whole).max()) > 1e-3


def test_a_stream_whose_first_frame_is_the_end_is_one_final_chunk_the_decoder_answers_with_no_audio(checkpoint):
    """The talker's end at its first step (the end cascade from step 0): no audio frame. It
    was a 500, then a 400; it is a valid, empty response now: one final chunk that is all
    context, which the decoder stage answers with no samples."""
    from tritontts.families.higgs_audio_v2.stages import HiggsAudioV2DecoderStage

    steps = random_steps(9, True)
    assert audio_frames(torch.stack(steps), checkpoint.config, finished=True) == 0
    (chunk,) = run_talker(talker_stage(checkpoint, steps))
    assert chunk[IS_FINAL] and chunk["codes"].shape[0] == chunk["left_context"] == 1
    decoder = HiggsAudioV2DecoderStage(StageContext("higgs_audio_v2_decoder", checkpoint.root), checkpoint)
    (result,) = decoder.run_batch([Inputs(codes=chunk["codes"], left_context=np.array([1]),
                                          right_context=np.array([0]))])
    assert not isinstance(result, Exception) and result["audio"].size == 0


def test_a_streams_chunks_batched_together_decode_exactly_as_each_alone(checkpoint):
    """The seeded-replay issue's root cause: the decoder's float sums depend on the batch's
    row count, so a stream's chunks that Triton's batcher happened to queue together (a
    timing, not a request) decoded to other PCM than the same chunks decoded one by one.
    A stream's chunks now go in successive calls; other streams' chunks still share one.
    Control: the same two windows from two streams, computed as one batch, differ from
    alone (so this test can see the difference it rules out)."""
    from tritontts.families.higgs_audio_v2.stages import HiggsAudioV2DecoderStage

    decoder = HiggsAudioV2DecoderStage(StageContext("higgs_audio_v2_decoder", checkpoint.root), checkpoint)
    rng = np.random.default_rng(5)

    def chunk(stream: int, seed: int) -> Inputs:
        codes = np.random.default_rng(seed).integers(0, 1024, (45, 8)).astype(np.int32)
        return Inputs(codes=codes, left_context=np.array([10]), right_context=np.array([10]),
                      stream_id=np.array([stream], np.int64))

    stream = int(rng.integers(1, 2 ** 62))
    alone = [decoder.run_batch([chunk(stream, s)])[0]["audio"] for s in (1, 2)]
    together = [r["audio"] for r in decoder.run_batch([chunk(stream, 1), chunk(stream, 2)])]
    assert all(np.array_equal(a, t) for a, t in zip(alone, together))
    batched = [r["audio"] for r in decoder.run_batch([chunk(stream, 1), chunk(stream + 1, 2)])]
    assert max(float(np.abs(a - b).max()) for a, b in zip(alone, batched)) > 0
