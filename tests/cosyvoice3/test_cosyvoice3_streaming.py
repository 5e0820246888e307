"""Chunked flow + HiFT (the stages' per-chunk work, in the talker's hop schedule) against
one whole-utterance flow + HiFT run, on the tiny checkpoint; and the reference cache."""
from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tritontts.families.cosyvoice3.checkpoint import open_checkpoint
from tritontts.families.cosyvoice3.hops import HopSchedule, TokenChunker
from tritontts.families.cosyvoice3.request import parse_cosyvoice3_params
from tritontts.families.cosyvoice3.stages import (
    CosyVoice3FlowStage, CosyVoice3HiftStage, CosyVoice3PromptStage)
from tritontts.serving.stage import StageContext

TALKER_SETTINGS = Path(__file__).resolve().parents[2] / "model_repository/cosyvoice3_talker/1/model.json"


def context(name: str) -> StageContext:
    return StageContext(name, Path("."))


@pytest.fixture(scope="module")
def parts(tiny_cosyvoice3):
    ckpt = open_checkpoint(tiny_cosyvoice3)
    frontend = CosyVoice3PromptStage(context("cosyvoice3_prompt"), ckpt)
    rate = 24000
    t = np.arange(rate * 2) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 140 * t)).astype(np.float32), rate, format="WAV")
    params = {"ref_audio": base64.b64encode(buf.getvalue()).decode(), "ref_text": "Reference."}
    job = frontend.prepare("Some words to say.", "", parse_cosyvoice3_params(params))
    return (frontend, params, job, CosyVoice3FlowStage(context("cosyvoice3_flow"), ckpt),
            CosyVoice3HiftStage(context("cosyvoice3_hift"), ckpt))


def served_schedule(lookahead: int) -> HopSchedule:
    """The hop schedule the talker serves with: model.json's hops, the flow's lookahead."""
    return HopSchedule(**json.loads(TALKER_SETTINGS.read_text())["hops"], lookahead=lookahead)


def chunked(flow, hift, job, tokens, schedule):
    prompt = job.prompt
    chunker = TokenChunker(schedule, prompt.speech_tokens.size)
    pieces = []
    for n in range(1, tokens.size + 1):
        chunk = chunker.poll(n)
        if chunk:
            mel = flow.mel(tokens[:chunk.tokens_upto], prompt.speech_tokens, prompt.mel, prompt.embedding, False)
            pieces.append(hift.new_audio(mel, chunk.token_offset, False))
    last = chunker.finish(tokens.size)
    mel = flow.mel(tokens, prompt.speech_tokens, prompt.mel, prompt.embedding, True)
    pieces.append(hift.new_audio(mel, last.token_offset, True))
    return pieces


@pytest.mark.parametrize("hops", [
    # Hops on the DiT's 25-token attention chunks: chunks equal the whole run (4.9e-8).
    {"first_hop": 25, "max_hop": 25, "scale": 1},
    # The served schedule (15 tokens first): a cut inside an attention chunk lets earlier
    # audio see less right context than the whole run, so it is close, not equal (1.7e-6).
    None,
], ids=["dit_chunk_hops", "served_hops"])
def test_chunked_flow_and_hift_equal_whole_utterance_within_1e_4_of_peak(parts, hops, tiny_cosyvoice3):
    frontend, params, job, flow, hift = parts
    lookahead = int(open_checkpoint(tiny_cosyvoice3).config["flow"]["pre_lookahead_len"])
    schedule = served_schedule(lookahead) if hops is None else HopSchedule(**hops, lookahead=lookahead)
    tokens = np.random.default_rng(0).integers(0, 6561, 130).astype(np.int32)
    pieces = chunked(flow, hift, job, tokens, schedule)
    mel = flow.mel(tokens, job.prompt.speech_tokens, job.prompt.mel, job.prompt.embedding, True)
    whole = hift.new_audio(mel, 0, True)
    streamed = np.concatenate(pieces)
    assert len(pieces) >= 3 and streamed.size == whole.size == 2 * 480 * tokens.size
    diff, peak = float(np.abs(streamed - whole).max()), float(np.abs(whole).max())
    print(f"first_hop={schedule.first_hop}: {len(pieces)} chunks, max-abs-diff vs whole {diff:.2e} "
          f"(peak {peak:.3f}, relative {diff / peak:.1e})")
    assert diff <= 1e-4 * peak


def test_reference_prompt_is_cached_by_content(parts):
    frontend, params, job, _, _ = parts
    hits = frontend.extractor.cache.hits
    again = frontend.prepare("Other words.", "", parse_cosyvoice3_params(params))
    assert frontend.extractor.cache.hits == hits + 1
    assert again.prompt is job.prompt
    changed = frontend.prepare("Other words.", "", parse_cosyvoice3_params({**params, "ref_text": "Another transcript."}))
    assert changed.prompt is not job.prompt and frontend.extractor.cache.hits == hits + 1


def test_long_input_is_spoken_in_segments(parts):
    from tritontts.families.cosyvoice3.stages import SEGMENT_TEXT_TOKENS

    frontend, params, _, _, _ = parts
    sentence = "Hello there, how are you today?"
    segments = frontend.text_segments(" ".join([sentence] * 20))
    sentence_ids = frontend.extractor.tokenizer.encode(sentence)
    assert len(segments) >= 3 and all(len(s) <= SEGMENT_TEXT_TOKENS for s in segments)
    assert segments[0][:len(sentence_ids)] == sentence_ids
    job = frontend.prepare(" ".join([sentence] * 20), "", parse_cosyvoice3_params(params))
    assert len(job.segments) == len(segments)
    assert all(s.prompt_ids[-len(job.prompt.speech_tokens):] == [frontend.vocab.speech_offset + t for t in
               job.prompt.speech_tokens.tolist()] for s in job.segments)


def test_flow_and_hift_compute_a_batch_of_mixed_chunks_as_each_alone_and_fail_only_the_bad_one(parts):
    """What Triton's dynamic batcher hands the flow and HiFT stages: first and later chunks
    of several streams, two lengths, a finalizing one, and one malformed request. Each
    result equals that request computed alone within 1e-5; the bad one fails alone."""
    from tritontts.serving.stage import Inputs

    _, _, job, flow, hift = parts
    p = job.prompt
    rng = np.random.default_rng(1)
    tokens = lambda n: rng.integers(0, 6561, n).astype(np.int32)  # noqa: E731
    chunk = lambda t, end, mel=p.mel: Inputs(  # noqa: E731
        speech_tokens=t, prompt_tokens=p.speech_tokens, prompt_mel=mel, embedding=p.embedding,
        segment_end=np.array([end]))
    batch = [chunk(tokens(18), False), chunk(tokens(18), False), chunk(tokens(43), False),
             chunk(tokens(18), False, mel=p.mel[:, :7]), chunk(tokens(43), False), chunk(tokens(30), True)]
    together = flow.run_batch(batch)
    assert isinstance(together[3], Exception)
    mels = {}
    for i, result in enumerate(together):
        if i == 3:
            continue
        alone = flow.run(batch[i])["mel"]
        assert result["mel"].shape == alone.shape and alone.shape[0] > 0
        assert np.abs(result["mel"] - alone).max() <= 1e-5, i
        mels[i] = alone
    assert np.abs(mels[0] - mels[1]).max() > 1e-3          # the control: different chunks differ

    voc = [Inputs(mel=mels[i], token_offset=np.array([offset]), segment_end=np.array([end]))
           for i, offset, end in ((0, 0, False), (1, 10, False), (2, 20, False), (4, 0, False), (5, 0, True))]
    together = hift.run_batch(voc)
    for i, result in enumerate(together):
        alone = hift.run(voc[i])["audio"]
        assert result["audio"].shape == alone.shape and alone.size > 0
        assert np.abs(result["audio"] - alone).max() <= 1e-5, i
    assert np.abs(together[0]["audio"][-1000:] - together[1]["audio"][-1000:]).max() > 1e-4
