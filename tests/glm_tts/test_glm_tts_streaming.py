"""GLM-TTS streaming through the flow and vocoder stages (tritontts.families.glm_tts.stages), chunk by
chunk as the ensemble hands them on, on the tiny random checkpoint.

Reference: vLLM-Omni 0.30's implementation of upstream's Token2Wav.token2wav_stream. Its
stage input processor (`ar_to_dit_async_chunk`, fed one speech token per step with the
deploy config's connector settings, deploy/glm_tts.yaml) makes each chunk's payload, and
`GLMTTSDiTForGeneration.forward` -> `_forward_full` (block-causal flow with the carried
trajectory, `_do_sample`; HiFT; `_slice_streaming_audio`, the wav pointer and cross-fade)
turns it into audio. Their wrapper is built on the meta device (its __init__ hard-codes the
released DiT sizes) and then given the tiny DiT with the checkpoint's weights, and our HiFT
as its vocoder (test_glm_tts_vocoder shows theirs equals ours given the same noise). Their
ODE noise is a fresh torch.randn per chunk; the test hands it ours, frame_noise(seed +
segment, frames), the one difference by design.

The prompt is 12 tokens: its attention block is int(12 / 12.5 * 22050 / 256) = 82 frames
(upstream converts block sizes at 6.89 frames per token, not the mel's 2), so 300 tokens
reach four blocks. A real 3-10 s prompt gives a 500-1700 frame first block, within which
attention is full.
"""
from __future__ import annotations

import importlib
import types
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch
import yaml

from tritontts.families.glm_tts.flow import frame_noise
from tritontts.families.glm_tts.random_checkpoint import SIZES
from tritontts.families.glm_tts.stages import FADE_SECONDS, GLMTTSFlowStage, GLMTTSVocoderStage
from tritontts.families.glm_tts.talker import BLOCK_SIZES, Chunker
from tritontts.families.glm_tts.vocoder import load_hift
from tritontts.protocol import AUDIO
from tritontts.serving.stage import Inputs, StageContext
from tritontts.families.glm_tts.upstream import glm_tts_dit_stand_ins
from tritontts.upstream import vllm_omni_module

pytestmark = pytest.mark.usefixtures("torch_two_threads")

SAMPLE_RATE = 24000
SAMPLES_PER_TOKEN = 960          # 2 mel frames of 480 samples
FADE = int(FADE_SECONDS * SAMPLE_RATE)
PROMPT_TOKENS = 12
SEED = 7
TOTAL = 300                      # chunks at 25, 75, 275 tokens and the last at 300
TOLERANCE = 1e-4                 # of the streamed audio's peak


STAND_INS = glm_tts_dit_stand_ins()
REFERENCE_ROOT = Path(importlib.util.find_spec("vllm_omni").submodule_search_locations[0])


@pytest.fixture(scope="module")
def reference():
    with vllm_omni_module("vllm_omni.model_executor.models.glm_tts.glm_tts_dit_wrapper",
                          STAND_INS) as wrapper:
        yield types.SimpleNamespace(
            wrapper=wrapper,
            dit=importlib.import_module("vllm_omni.model_executor.models.glm_tts.glm_tts_dit"),
            processor=importlib.import_module(
                "vllm_omni.model_executor.stage_input_processors.glm_tts"))


def make_stages(checkpoint):
    # Both cores (a stage sets torch's thread count from its torch_threads parameter).
    context = lambda name: StageContext(name=name, model_dir=Path("model_repository") / name,  # noqa: E731
                                        parameters={"torch_threads": "2"})
    return (GLMTTSFlowStage(context("glm_tts_flow"), checkpoint),
            GLMTTSVocoderStage(context("glm_tts_vocoder"), checkpoint))


@pytest.fixture(scope="module")
def stages(checkpoint):
    return make_stages(checkpoint)


# --- requests and chunks ---------------------------------------------------------------------

@dataclass
class Voice:
    prompt_tokens: np.ndarray    # [P] int32
    prompt_mel: np.ndarray       # [2P, 80] float32
    embedding: np.ndarray        # [192] float32


def voice(seed: int = 1) -> Voice:
    rng = np.random.default_rng(seed)
    return Voice(rng.integers(0, 32768, PROMPT_TOKENS).astype(np.int32),
                 rng.normal(size=(2 * PROMPT_TOKENS, 80)).astype(np.float32),
                 rng.normal(size=192).astype(np.float32))


def speech(n: int, seed: int = 2) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 32768, n).astype(np.int32)


def chunk_plan(n_tokens: int):
    """The talker's chunks for a segment of n_tokens, its token count rising one at a time."""
    chunker, chunks = Chunker(), []
    for count in range(1, n_tokens + 1):
        while (chunk := chunker.poll(count)) is not None:
            chunks.append(chunk)
    return chunks + [chunker.finish(n_tokens)]


def chunk_inputs(v: Voice, tokens: np.ndarray, stream_id: int, seed: int = SEED, segment: int = 0,
                 last_segment: bool = True):
    """Per chunk, the flow stage's inputs as the ensemble assembles them: the talker's
    outputs (tokens so far, segment, chunk_in_segment, look_ahead, segment_end, is_final)
    and the prompt stage's (voice, seed, stream id)."""
    for chunk in chunk_plan(tokens.size):
        yield Inputs(
            speech_tokens=tokens[:chunk.tokens].astype(np.int32),
            segment=np.array([segment], np.int32),
            chunk_in_segment=np.array([chunk.index], np.int32),
            look_ahead=np.array([chunk.look_ahead], np.int32),
            segment_end=np.array([chunk.last]),
            prompt_tokens=v.prompt_tokens, prompt_mel=v.prompt_mel, embedding=v.embedding,
            seed=np.array([seed], np.int64), stream_id=np.array([stream_id], np.int64),
            chunk_index=np.array([chunk.index], np.int32),
            is_final=np.array([chunk.last and last_segment]))


def run_chunk(flow: GLMTTSFlowStage, vocoder: GLMTTSVocoderStage, step: Inputs):
    """One chunk through both stages -> (mel [frames, 80], emitted audio)."""
    out = flow.run(step)
    frames = int(out["frames"])
    audio = vocoder.run(Inputs(mel=out["mel"], frames=np.array([frames], np.int32),
                               **{k: step[k] for k in ("chunk_in_segment", "look_ahead",
                                                       "segment_end", "stream_id",
                                                       "chunk_index", "is_final")}))[AUDIO]
    return out["mel"][:frames], np.asarray(audio, np.float32)


def stream(flow, vocoder, v: Voice, tokens: np.ndarray, stream_id: int, **kw):
    return [run_chunk(flow, vocoder, step) for step in chunk_inputs(v, tokens, stream_id, **kw)]


class RecordRuns:
    """Records the vocoder stage's whole-mel audio of each run (before stitching)."""

    def __init__(self, vocoder: GLMTTSVocoderStage, monkeypatch):
        self.runs: list[np.ndarray] = []
        real = vocoder.audio

        def audio(mel):
            self.runs.append(real(mel))
            return self.runs[-1]

        monkeypatch.setattr(vocoder, "audio", audio)


# --- vLLM-Omni's streaming path ----------------------------------------------------------------

def their_dit(reference, checkpoint):
    """Their GLMTTSDiT at the tiny sizes with flow.pt's weights: every key must load; only
    the rotary buffer (a function of the head width) is left out, as their load_weights
    leaves it out."""
    tiny = SIZES["tiny"]["dit"]
    dit = reference.dit.GLMTTSDiT(
        trans_dim=tiny["dim"], depth=tiny["depth"], heads=tiny["heads"], dim_head=64, ff_mult=2,
        dropout=0.0, mel_dim=80, text_vocab_size=tiny["vocab"], text_emb_dim=tiny["token_dim"],
        conv_layers=tiny["conv_layers"], condition_dim=80, spkr_emb_adaln=True, spkr_dim=192)
    state = {k.removeprefix("estimator."): v for k, v in checkpoint.flow_state().items()
             if k.startswith("estimator.") and "rotary_embed" not in k}
    missing, unexpected = dit.load_state_dict(state, strict=False)
    assert not unexpected and all("inv_freq" in k for k in missing), (missing, unexpected)
    return dit.eval()


def their_model(reference, checkpoint):
    """GLMTTSDiTForGeneration through its own __init__ (flow config read from flow/config.yaml,
    no CUDA graphs, max_num_seqs 1 as deployed), on the meta device so the released-size DiT
    it builds costs nothing; then the tiny DiT and our HiFT."""
    config = types.SimpleNamespace(
        model_config=types.SimpleNamespace(hf_config=types.SimpleNamespace(),
                                           model=str(checkpoint.root), tokenizer=None,
                                           dtype=torch.float32, stage_connector_config=None),
        scheduler_config=types.SimpleNamespace(max_num_seqs=1))
    with torch.device("meta"):
        model = reference.wrapper.GLMTTSDiTForGeneration(vllm_config=config)
    model.dit = their_dit(reference, checkpoint)
    # Their HiFTWrapper (its __call__ is what _forward_full runs) around our HiFT.
    hift = importlib.import_module("vllm_omni.model_executor.models.glm_tts.vocoder").HiFTWrapper
    model._vocoder = hift.__new__(hift)
    model._vocoder.device, model._vocoder.sample_rate = torch.device("cpu"), SAMPLE_RATE
    model._vocoder.model = load_hift(checkpoint.path("hift/hift.pt"))
    model._vocoder_sample_rate = SAMPLE_RATE
    assert (model.n_timesteps, model.inference_cfg_rate, model.t_scheduler) == (10, 0.7, "cosine")
    return model


def connector_extra() -> dict:
    """The connector settings vLLM-Omni deploys GLM-TTS with (chunks of 25, 50, 200)."""
    deploy = yaml.safe_load((REFERENCE_ROOT / "deploy" / "glm_tts.yaml").read_text())
    return deploy["connectors"]["glm_tts_shm"]["extra"]


def their_payloads(reference, v: Voice, tokens: np.ndarray, req_id: str):
    """Their stage input processor fed one AR step at a time (the voice with the first
    step's output, the end flagged with the last token): the chunk payloads it emits."""
    manager = types.SimpleNamespace(connector=types.SimpleNamespace(
        config={"extra": connector_extra()}))
    request = types.SimpleNamespace(external_req_id=req_id, request_id=req_id,
                                    additional_information=None, is_finished=lambda: False)
    payloads = []
    for i, token in enumerate(tokens.tolist()):
        output = {"speech_tokens": torch.tensor([token])}
        if i == 0:
            output.update(prompt_speech_token=torch.from_numpy(v.prompt_tokens).long(),
                          prompt_feat=torch.from_numpy(v.prompt_mel),
                          embedding=torch.from_numpy(v.embedding))
        payload = reference.processor.ar_to_dit_async_chunk(
            manager, output, request, is_finished=i == tokens.size - 1)
        if payload is not None:
            payloads.append(payload)
    return payloads


def runtime_info(payload) -> dict:
    """The DiT stage's per-request info from a payload: its nested meta / embed dicts and
    kv_metadata, as forward() reads them."""
    def fields(struct):
        return {k: v for k, v in msgspec.structs.asdict(struct).items() if v is not None}

    info = {"meta": fields(payload.meta), "kv_metadata": payload.kv_metadata}
    if payload.embed is not None:
        info["embed"] = fields(payload.embed)
    return info


def their_chunk(model, payload, seed: int, monkeypatch, mels: list):
    """forward() on one payload with our ODE noise -> emitted audio (their mel appended)."""
    ids = payload.codes.audio
    frames = int((PROMPT_TOKENS + ids.numel()) / 25 * 50)
    noise = frame_noise(seed, frames)
    real_randn, draws = torch.randn, []

    def randn(*args, **kwargs):
        if len(args) == 1 and tuple(args[0]) == (1, frames, 80):
            draws.append(tuple(args[0]))
            return noise.clone()
        return real_randn(*args, **kwargs)    # anything else (none expected) draws as usual

    sample = type(model)._do_sample

    def recording_sample(**kwargs):
        mel, cache = sample(model, **kwargs)
        mels.append(mel[0, PROMPT_TOKENS * 2:].float().numpy())
        return mel, cache

    monkeypatch.setattr(torch, "randn", randn)
    monkeypatch.setattr(model, "_do_sample", recording_sample, raising=False)
    try:
        out = model.forward(ids, torch.arange(ids.numel()), model_intermediate_buffer=[runtime_info(payload)])
    finally:
        monkeypatch.undo()
    assert draws == [(1, frames, 80)]
    return out.multimodal_outputs["audio"][0].numpy()


@pytest.fixture(scope="module")
def streamed(checkpoint, reference):
    """Our chunks and vLLM-Omni's on the same voice, tokens and noise: (ours [(mel,
    audio)], their mels, their audio, their payloads), plus our per-run vocoder audio."""
    flow, vocoder = make_stages(checkpoint)
    v, tokens = voice(), speech(TOTAL)
    with pytest.MonkeyPatch.context() as mp:
        recorder = RecordRuns(vocoder, mp)
        ours = stream(flow, vocoder, v, tokens, stream_id=5)
    model = their_model(reference, checkpoint)
    payloads = their_payloads(reference, v, tokens, "req-5")
    their_mels, their_audio = [], []
    with pytest.MonkeyPatch.context() as mp:
        for payload in payloads:
            their_audio.append(their_chunk(model, payload, SEED, mp, their_mels))
    assert not model._stream_state_by_req        # their state went at stream_finished
    return types.SimpleNamespace(voice=v, tokens=tokens, ours=ours, their_mels=their_mels,
                                 their_audio=their_audio, payloads=payloads, runs=recorder.runs,
                                 model=model)


# --- 1. parity with vLLM-Omni -------------------------------------------------------------------

def test_their_processor_cuts_the_same_chunks_with_upstreams_block_pattern_and_look_ahead(streamed):
    """The chunks agree when the end is off a chunk boundary (300). On a boundary they
    would not: their processor emits the boundary chunk as non-final at once, and an end
    flagged afterwards gets a token-less terminal payload, whose audio is empty, so the
    held-back look-ahead and fade never play; our Chunker waits for one token past a
    boundary and makes that chunk the last."""
    chunks = chunk_plan(TOTAL)
    assert [c.tokens for c in chunks] == [25, 75, 275, 300]
    assert [c.look_ahead for c in chunks] == [12, 25, 100, 0]
    assert [p.codes.audio.numel() for p in streamed.payloads] == [c.tokens for c in chunks]
    for payload, chunk in zip(streamed.payloads, chunks):
        private = payload.kv_metadata["glm_tts"]
        assert private["block_pattern"] == list(BLOCK_SIZES)
        # _forward_full's look-ahead is the chunk's size // 2: the talker's look-ahead.
        if not chunk.last:
            assert private["chunk_sizes_history"][-1] // 2 == chunk.look_ahead
        assert bool(payload.meta.stream_finished) == chunk.last
    assert streamed.payloads[0].embed is not None
    assert all(p.embed is None for p in streamed.payloads[1:])


def test_streamed_chunks_match_vllm_omni_streaming_path(streamed, checkpoint, monkeypatch):
    ours, their_audio, their_mels = streamed.ours, streamed.their_audio, streamed.their_mels
    assert len(ours) == len(their_audio) == len(their_mels) == 4
    peak = max(np.abs(a).max() for _, a in ours)
    assert peak > 1e-3
    for k, ((mel, audio), theirs, their_mel) in enumerate(zip(ours, their_audio, their_mels)):
        mel_diff = np.abs(mel - their_mel).max()
        assert audio.shape == theirs.shape, (k, audio.shape, theirs.shape)
        diff = np.abs(audio - theirs).max() / peak
        print(f"chunk {k}: {audio.size} samples, mel max-abs-diff {mel_diff:.2e}, "
              f"audio max-abs-diff / peak {diff:.2e}")
        assert mel_diff <= 1e-4
        assert diff <= TOLERANCE

    # Negative control: without the carried trajectory (chunk 1's flow starts afresh),
    # chunk 1 differs from theirs.
    flow, vocoder = make_stages(checkpoint)
    monkeypatch.setattr(flow.caches, "get", lambda key, make=None: None)
    fresh = [run_chunk(flow, vocoder, step) for step in
             list(chunk_inputs(streamed.voice, streamed.tokens, stream_id=5))[:2]]
    assert np.array_equal(fresh[0][1], ours[0][1])       # chunk 0 has nothing to carry
    worst = np.abs(fresh[1][1] - their_audio[1]).max() / peak
    print(f"negative control, chunk 1 without the carried trajectory: "
          f"max-abs-diff / peak {worst:.2e}")
    assert worst > 100 * TOLERANCE


def test_stitching_on_the_same_runs_matches_their_slice_streaming_audio(streamed):
    """Their _slice_streaming_audio given our vocoder's whole-mel audio of each run, with
    the look-ahead _forward_full derives from the payload, emits exactly our chunks: the
    wav pointer, fade tail and hold-back agree on their own, apart from the flow."""
    model, chunks = streamed.model, chunk_plan(TOTAL)
    for chunk, run, (_, ours) in zip(chunks, streamed.runs, streamed.ours):
        look_ahead_frames = int((chunk.tokens - (chunks[chunk.index - 1].tokens if chunk.index else 0))
                                // 2 / 25 * 50)
        emitted = model._slice_streaming_audio(
            torch.from_numpy(run), req_id="stitch", stream_finished=chunk.last,
            lookahead_mel_len=look_ahead_frames, crossfade_sec=FADE_SECONDS).numpy()
        assert np.abs(emitted - ours).max() <= 1e-6
    # Negative control: another look-ahead moves every boundary.
    other = model._slice_streaming_audio(torch.from_numpy(streamed.runs[0]), req_id="other",
                                         stream_finished=False, lookahead_mel_len=2 * 25,
                                         crossfade_sec=FADE_SECONDS).numpy()
    assert other.size != streamed.ours[0][1].size


# --- 2. lengths and cross-fade bookkeeping --------------------------------------------------------

@pytest.mark.parametrize("total", [24, 25, 26, 80, TOTAL])
def test_emitted_audio_adds_up_to_the_final_run_and_each_chunk_stitches_its_runs(
        total, stages, streamed, monkeypatch):
    """Concatenated chunks are as long as the final run's audio (total * 960 samples). Each
    non-final chunk ends look_ahead tokens + 0.1 s before its run's end; its first 0.1 s
    fades from the previous run's audio there to this run's; the rest is this run's."""
    if total == TOTAL:
        runs, emitted = streamed.runs, [a for _, a in streamed.ours]
    else:
        flow, vocoder = stages
        recorder = RecordRuns(vocoder, monkeypatch)
        emitted = [a for _, a in stream(flow, vocoder, voice(), speech(total), stream_id=100 + total)]
        runs = recorder.runs
    chunks = chunk_plan(total)
    assert len(emitted) == len(runs) == len(chunks)
    assert runs[-1].size == total * SAMPLES_PER_TOKEN
    assert sum(a.size for a in emitted) == runs[-1].size
    sent = 0
    fade_in = np.linspace(0.0, 1.0, FADE, dtype=np.float32)
    for k, (chunk, audio, run) in enumerate(zip(chunks, emitted, runs)):
        assert run.size == chunk.tokens * SAMPLES_PER_TOKEN
        end = run.size if chunk.last else run.size - chunk.look_ahead * SAMPLES_PER_TOKEN - FADE
        assert audio.size == end - sent, k
        head = 0
        if k:
            head = FADE
            blended = runs[k - 1][sent:sent + FADE] * (1 - fade_in) + run[sent:sent + FADE] * fade_in
            assert np.abs(audio[:FADE] - blended).max() <= 1e-6
        assert np.array_equal(audio[head:], run[sent + head:end])
        sent = end


# --- 3. streamed vs whole utterance --------------------------------------------------------------

def test_streamed_audio_against_a_whole_utterance_run(streamed, stages):
    """Streaming (block-causal attention, re-runs with the carried trajectory, cross-fades)
    does not reproduce a whole-utterance run (full attention, one run) by design: measured
    and printed only. What holds: same length, both finite, and the first chunk equals the
    whole-utterance run of its own 25 tokens, since those frames all lie within the
    prompt's attention block (82 frames; 24 + 50 here) where the mask is full."""
    flow, vocoder = stages
    v, tokens = streamed.voice, streamed.tokens
    audio = np.concatenate([a for _, a in streamed.ours])

    def whole(n: int) -> np.ndarray:
        frames = flow.flow.frames_for(PROMPT_TOKENS + n)
        mel, _ = flow.flow.inference(
            torch.from_numpy(tokens[:n]).long()[None], torch.from_numpy(v.prompt_tokens).long()[None],
            torch.from_numpy(v.prompt_mel)[None], torch.from_numpy(v.embedding)[None],
            frame_noise(SEED, frames), block_pattern=None)
        return vocoder.audio(mel[0].numpy())

    reference = whole(TOTAL)
    assert reference.shape == audio.shape
    assert np.isfinite(audio).all() and np.isfinite(reference).all()
    peak = np.abs(reference).max()
    diff = np.abs(audio - reference).max() / peak
    rel_rms = np.sqrt(np.mean((audio - reference) ** 2) / np.mean(reference ** 2))
    print(f"streamed vs whole utterance ({TOTAL} tokens): max-abs-diff / peak {diff:.3f}, "
          f"relative RMS error {rel_rms:.3f}")
    per_chunk, start = [], 0
    for _, a in streamed.ours:
        seg = slice(start, start + a.size)
        per_chunk.append(np.sqrt(np.mean((a - reference[seg]) ** 2) / np.mean(reference[seg] ** 2)))
        start += a.size
    print("  relative RMS error per chunk: " + ", ".join(f"{e:.3f}" for e in per_chunk))

    first = streamed.ours[0][1]
    assert np.abs(first - whole(25)[:first.size]).max() <= 1e-5 * peak
    # ...but not the 300-token whole run there: later tokens reach back through attention.
    assert np.abs(first - reference[:first.size]).max() > 1e-3 * peak


# --- 4. per-stream state ------------------------------------------------------------------------

def test_interleaved_streams_each_sound_as_alone_and_state_goes_at_segment_end(checkpoint, stages):
    flow, vocoder = stages
    a = (voice(3), speech(40, 4), 9)          # chunks at 25 and 40 tokens
    b = (voice(5), speech(80, 6), 11)         # 25, 75, 80
    alone = [[x for _, x in stream(flow, vocoder, v, t, stream_id=1000 + i, seed=s)]
             for i, (v, t, s) in enumerate((a, b))]
    assert not flow.caches.items and not vocoder.streams.items

    steps = [list(chunk_inputs(v, t, stream_id=sid, seed=s)) for sid, (v, t, s) in ((1, a), (2, b))]
    got = {1: [], 2: []}
    for i in range(max(map(len, steps))):
        for sid, own in ((1, steps[0]), (2, steps[1])):
            if i < len(own):
                got[sid].append(run_chunk(flow, vocoder, own[i])[1])
                last = bool(own[i]["segment_end"][0])
                # A stream's state lives until its segment's last chunk, and no longer.
                assert (sid in flow.caches.items) == (not last)
                assert (sid in vocoder.streams.items) == (not last)
    for sid, want in ((1, alone[0]), (2, alone[1])):
        assert len(got[sid]) == len(want)
        for x, y in zip(got[sid], want):
            assert x.shape == y.shape and np.abs(x - y).max() <= 1e-6


def test_chunk_0_of_a_new_segment_resets_a_streams_state(checkpoint, stages):
    """A segment abandoned mid-way (no last chunk) leaves state; the next segment's chunk 0
    starts afresh: segment 1 with seed 8 sounds as segment 0 with seed 9 alone."""
    flow, vocoder = stages
    v, first, second = voice(7), speech(40, 8), speech(40, 9)
    alone = [x for _, x in stream(flow, vocoder, v, second, stream_id=2000, seed=9)]

    abandoned = list(chunk_inputs(v, first, stream_id=3, seed=8))[:1]
    for step in abandoned:
        run_chunk(flow, vocoder, step)
    assert 3 in flow.caches.items and 3 in vocoder.streams.items
    steps = list(chunk_inputs(v, second, stream_id=3, seed=8, segment=1))
    got = [run_chunk(flow, vocoder, step)[1] for step in steps]
    assert 3 not in flow.caches.items and 3 not in vocoder.streams.items
    for x, y in zip(got, alone):
        assert x.shape == y.shape and np.abs(x - y).max() <= 1e-6

    # Negative control: the new segment's first chunk sent as if it continued the
    # abandoned segment (chunk_in_segment 1) reuses its trajectory and wav pointer.
    for step in abandoned:
        run_chunk(flow, vocoder, step)
    stale = dict(steps[0])
    stale["chunk_in_segment"] = np.array([1], np.int32)
    continued = run_chunk(flow, vocoder, Inputs(stale))[1]
    assert continued.shape != alone[0].shape or np.abs(continued - alone[0]).max() > 1e-3
    flow.caches.pop(3)
    vocoder.streams.pop(3)
