"""Voxtral TTS's codec decoder (ours) against vLLM-Omni 0.30's VoxtralTTSAudioTokenizer
(decode in fp32) on the same random weights, with a perturbed weight as the negative control;
its windows with context_frames() of left context decode exactly as the whole utterance
(float64: to 1e-14; one frame less differs)."""
from __future__ import annotations

import types

import pytest
import torch

from tritontts.weights.checkpoint import ConfigFields
from tritontts.upstream import vllm_omni_module
from tritontts.families.voxtral_tts.codec import PREFIX, CodecConfig, load_codec

# Small widths; the released rates and layer plan (patch 240, 4 x 2 layers, windows 2-16).
ARGS = {"dim": 64, "hidden_dim": 128, "head_dim": 16, "n_heads": 4, "n_kv_heads": 2,
        "semantic_codebook_size": 64, "semantic_dim": 16, "acoustic_codebook_size": 21,
        "acoustic_dim": 36, "norm_eps": 0.01, "layer_scale_init": 0.01}


def config() -> CodecConfig:
    from pathlib import Path

    return CodecConfig.from_dict(ARGS, ConfigFields(ARGS, Path("params.json"), "audio_tokenizer_args."))


def random_state(c: CodecConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    from tritontts.families.voxtral_tts.random_checkpoint import random_codec_state

    return {PREFIX + k: v for k, v in random_codec_state(c, torch.Generator().manual_seed(seed)).items()}


def reference(c_args: dict, state: dict[str, torch.Tensor]):
    with vllm_omni_module("vllm_omni.model_executor.models.voxtral_tts.voxtral_tts_audio_tokenizer") as m:
        hf = types.SimpleNamespace(audio_config={"codec_args": dict(c_args), "audio_model_args": {
            "semantic_codebook_size": c_args["semantic_codebook_size"],
            "acoustic_codebook_size": c_args["acoustic_codebook_size"],
            "n_acoustic_codebook": c_args["acoustic_dim"]}}, text_config=types.SimpleNamespace(hidden_size=32))
        model = m.VoxtralTTSAudioTokenizer(vllm_config=types.SimpleNamespace(
            model_config=types.SimpleNamespace(hf_config=hf)))
    ours = {k[len(PREFIX):]: v for k, v in state.items()}
    missing, unexpected = model.load_state_dict(ours, strict=False)
    assert not unexpected, unexpected
    assert all(k.startswith(("input_proj.", "encoder_blocks.", "audio_token_embedding.")) for k in missing), missing
    return model.float().eval()


def codes(c: CodecConfig, frames: int, seed: int = 1, batch: int = 2) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    semantic = torch.randint(0, c.semantic_codebook_size, (batch, 1, frames), generator=gen)
    acoustic = torch.randint(0, c.acoustic_codebook_size, (batch, c.acoustic_dim, frames), generator=gen)
    return torch.cat([semantic, acoustic], dim=1)


@pytest.fixture(scope="module")
def pair():
    c = config()
    state = random_state(c)
    return c, state, load_codec(state, c, "random"), reference(ARGS, state)


def test_config_reads_the_released_plan():
    c = config()
    assert c.decoder_windows() == [2, 4, 8, 16]
    assert c.samples_per_frame == 1920 and c.frame_rate == 12.5
    assert c.context_frames() == 21


def test_decode_matches_vllm_omni(pair):
    c, state, ours, ref = pair
    x = codes(c, 30)
    want = ref.decode(x, dtype=torch.float32)[:, 0]
    got = ours.decode(x)
    diff = (got - want).abs().max().item()
    print(f"decode: {tuple(got.shape)}, max-abs-diff {diff:.2e} (peak {want.abs().max():.2f})")
    assert got.shape == want.shape == (2, 30 * 1920) and diff < 1e-4
    # Negative control: one perturbed weight changes the audio.
    bad = dict(state)
    key = PREFIX + "decoder_blocks.3.layers.0.attention.wq.weight"
    bad[key] = bad[key] + 0.05
    assert (load_codec(bad, c, "perturbed").decode(x) - want).abs().max() > 1e-3


def test_windows_with_context_frames_decode_exactly_as_the_whole(pair):
    c, _, ours, _ = pair
    ours = ours.double()
    x = codes(c, 70, seed=2, batch=1)
    whole = ours.decode(x)[0]
    context, start, hop = c.context_frames(), 40, c.samples_per_frame

    def error(frames: int) -> float:
        window = ours.decode_window(x[..., start - frames:], frames)[0]
        return float((window - whole[start * hop:]).abs().max())

    print(f"{context} frames of context: {error(context):.1e}; one less: {error(context - 1):.1e}")
    # float64 rounding only (attention over windows of another length): 1e-14-ish.
    assert error(context) < 1e-12 and error(context - 1) > 1e-9
    # A window from the first frame needs no context.
    assert (ours.decode(x[..., :25])[0] - whole[:25 * hop]).abs().max() < 1e-12


def test_the_codec_stage_answers_the_final_chunk_of_a_stream_that_ended_at_its_first_frame_with_no_audio(checkpoint):
    """The talker's first frame was the end: one zero frame, all context
    (FrameChunkTalkerStage.chunk); the response is valid and empty."""
    import numpy as np

    from tritontts.families.voxtral_tts.stages import VoxtralTTSCodecStage
    from tritontts.serving.stage import Inputs, StageContext

    stage = VoxtralTTSCodecStage(StageContext("voxtral_tts_codec", checkpoint.root), checkpoint)
    (result,) = stage.run_batch([Inputs(codes=np.zeros((1, 37), np.int32), left_context=np.array([1]))])
    assert not isinstance(result, Exception) and result["audio"].size == 0
