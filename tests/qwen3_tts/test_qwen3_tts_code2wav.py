"""Qwen3-TTS Code2Wav (tritontts.families.qwen3_tts.code2wav) on a tiny random decoder, CPU, fp32.

The tiny decoder keeps the released structure and rates (16 codebooks of 2048 entries,
sliding window 72, attention wider than the residual stream, upsampling 2*2 then 8*5*4*3 =
1920 samples a frame) with small widths and 2 transformer layers. Its weights are drawn into
qwen-tts-compat's decoder, written as a speech_tokenizer/ folder (config.json +
model.safetensors under `decoder.`, beside encoder tensors that must be skipped), and loaded
with load_code2wav, so every parity test also covers the loader.
"""
from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import save_file

from tritontts.weights.checkpoint import CheckpointError
from tritontts.families.qwen3_tts.code2wav import (
    Code2WavConfig, Qwen3TTSCode2Wav, decode_chunk, decode_streaming, load_code2wav, plan_chunks)

SAMPLES_PER_FRAME = 1920
TINY = dict(
    codebook_size=2048, codebook_dim=16, num_quantizers=16, latent_dim=32, hidden_size=32,
    intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
    head_dim=16, attention_bias=False, sliding_window=72, rope_theta=10000, rms_norm_eps=1e-5,
    hidden_act="silu", layer_scale_initial_scale=0.01, max_position_embeddings=8000,
    upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2], decoder_dim=32,
    attention_dropout=0.0, num_semantic_quantizers=1)
# The released speech_tokenizer/config.json decoder_config (Qwen3-TTS-Tokenizer-12Hz),
# including the keys the decoder does not read.
RELEASED = dict(
    attention_bias=False, attention_dropout=0.0, latent_dim=1024, codebook_dim=512,
    codebook_size=2048, decoder_dim=1536, hidden_act="silu", hidden_size=512,
    intermediate_size=1024, layer_scale_initial_scale=0.01, max_position_embeddings=8000,
    head_dim=64, num_attention_heads=16, num_hidden_layers=8, num_key_value_heads=16,
    num_quantizers=16, num_semantic_quantizers=1, rms_norm_eps=1e-5, rope_theta=10000,
    semantic_codebook_size=4096, sliding_window=72, upsample_rates=[8, 5, 4, 3],
    upsampling_ratios=[2, 2], vector_quantization_hidden_dimension=512)
# Streaming utterance: longer than the tiny model's exact streaming context (154 frames), so
# some chunk windows start after frame 0. Parity utterances only need to pass the 72-frame
# attention window.
FRAMES = 180
PARITY_FRAMES = 80


@pytest.fixture(autouse=True, scope="module")
def _one_thread_plain_conv():
    """One thread (on a busy 2-core machine a second thread mostly spin-waits), and torch's
    own conv kernels instead of oneDNN's: oneDNN builds a primitive per new input length
    (~2 s each on this CPU), and streaming feeds many lengths. Both sides of every
    comparison run under the same setting."""
    threads, onednn = torch.get_num_threads(), torch.backends.mkldnn.enabled
    torch.set_num_threads(1)
    torch.backends.mkldnn.enabled = False
    yield
    torch.set_num_threads(threads)
    torch.backends.mkldnn.enabled = onednn


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Weights that keep every stage near unit scale, so the audio is lively but mostly
    unclipped, and large enough layer scales (0.2..0.6, released init 0.01) that attention,
    and with it the context a chunk sees, visibly matters. SnakeBeta of a large input is
    chaotic (sin(x * alpha)), which would turn float noise into O(1) differences."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "cluster_usage":
                value = 0.5 + 1.5 * torch.rand(p.shape, generator=gen)
            elif leaf == "embedding_sum":
                value = torch.randn(p.shape, generator=gen)
            elif leaf in ("alpha", "beta"):
                value = 0.3 * torch.randn(p.shape, generator=gen)
            elif leaf in ("scale", "gamma"):
                value = 0.2 + 0.4 * torch.rand(p.shape, generator=gen)
            elif "norm" in name and leaf == "weight":
                value = 1 + 0.1 * torch.randn(p.shape, generator=gen)
            elif leaf == "bias":
                value = 0.05 * torch.randn(p.shape, generator=gen)
            else:
                if ".block.1." in name:          # transposed conv k = 2 * stride: 2 taps per output
                    fan_in = 2 * p.shape[0]
                elif name.startswith("upsample.") and ".0.conv." in name:   # k = stride: 1 tap
                    fan_in = p.shape[0]
                else:
                    fan_in = p[0].numel()
                value = torch.randn(p.shape, generator=gen) / fan_in ** 0.5
                if "conv2" in name:              # residual branches: keep growth per unit low
                    value = value * 0.3
                if name.startswith("decoder.6."):     # output conv
                    value = value * 0.15
            p.copy_(value)
    return model


def make_codes(frames: int = FRAMES, batch: int = 1, seed: int = 3) -> torch.Tensor:
    return torch.randint(0, 2048, (batch, 16, frames), generator=torch.Generator().manual_seed(seed))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


def write_speech_tokenizer(folder, decoder_state: dict, decoder_config: dict, **top) -> None:
    """A speech_tokenizer/ folder in the released layout: the tokenizer model's state dict
    (decoder.* plus encoder.* the loader must skip) and its config.json."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"decoder.{k}": v.detach().clone().contiguous() for k, v in decoder_state.items()}
    tensors["encoder.quantizer.semantic_residual_vector_quantizer.layers.0.codebook.embed_sum"] = \
        torch.zeros(4, 3)
    tensors["encoder.encoder.layers.0.conv.weight"] = torch.zeros(2, 1, 7)
    save_file(tensors, str(folder / "model.safetensors"))
    config = {"model_type": "qwen3_tts_tokenizer_12hz", "encoder_config": {},
              "decoder_config": decoder_config, "encoder_valid_num_quantizers": 16,
              "input_sample_rate": 24000, "output_sample_rate": 24000,
              "decode_upsample_rate": 1920, "encode_downsample_rate": 1920, **top}
    (folder / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def qwen_tts_tokenizer():
    from tritontts.families.qwen3_tts.upstream import qwen_tts_module

    with qwen_tts_module("qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2") as module:
        yield module


@pytest.fixture(scope="module")
def reference(qwen_tts_tokenizer):
    """qwen-tts-compat's Qwen3TTSTokenizerV2Decoder at TINY with random weights."""
    torch.manual_seed(0)
    config = qwen_tts_tokenizer.Qwen3TTSTokenizerV2DecoderConfig(**TINY)
    return randomize(qwen_tts_tokenizer.Qwen3TTSTokenizerV2Decoder(config)).eval()


@pytest.fixture(scope="module")
def checkpoint(reference, tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3tts") / "speech_tokenizer"
    write_speech_tokenizer(folder, reference.state_dict(), TINY)
    return folder


@pytest.fixture(scope="module")
def ours(checkpoint) -> Qwen3TTSCode2Wav:
    return load_code2wav(checkpoint)


@pytest.fixture(scope="module")
def whole(ours) -> torch.Tensor:
    with torch.no_grad():
        return ours(make_codes())


# --- layout ---------------------------------------------------------------------------------

def test_released_config_builds_the_reference_key_layout(qwen_tts_tokenizer):
    """At the released sizes (meta device: shapes only) our state dict has exactly the
    reference decoder's 271 keys and shapes, i.e. speech_tokenizer/model.safetensors'
    decoder.* tensors with the prefix removed."""
    cfg = Code2WavConfig.from_dict(RELEASED)
    with torch.device("meta"):
        ours = Qwen3TTSCode2Wav(cfg)
        theirs = qwen_tts_tokenizer.Qwen3TTSTokenizerV2Decoder(
            qwen_tts_tokenizer.Qwen3TTSTokenizerV2DecoderConfig(**RELEASED))
    mine = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    want = {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    assert mine == want and len(mine) == 271
    assert mine["quantizer.rvq_first.vq.layers.0._codebook.embedding_sum"] == (2048, 256)
    assert mine["quantizer.rvq_rest.output_proj.weight"] == (512, 256, 1)
    assert mine["pre_transformer.layers.7.self_attn.q_proj.weight"] == (1024, 512)
    assert mine["decoder.0.conv.weight"] == (1536, 1024, 7)
    assert mine["decoder.6.conv.weight"] == (1, 96, 7)
    assert ours.samples_per_frame == SAMPLES_PER_FRAME
    # 10 frames of upsampler context + 8 layers * 71 + pre_conv's 2
    assert (ours.conv_context_frames, ours.exact_left_context_frames) == (10, 580)


def test_config_ignores_unread_keys_and_rejects_what_the_decoder_cannot_honour():
    assert Code2WavConfig.from_dict(RELEASED).head_dim == 64
    assert Code2WavConfig.from_dict({**RELEASED, "_name_or_path": "x", "model_type": ""}) == \
        Code2WavConfig.from_dict(RELEASED)
    assert Code2WavConfig.from_dict({"codebook_dim": 8}).head_dim == 1024 // 16
    for bad in ({**RELEASED, "num_semantic_quantizers": 2}, {**RELEASED, "partial_rotary_factor": 0.5},
                {**RELEASED, "rope_scaling": {"rope_type": "yarn", "factor": 2.0}},
                {**RELEASED, "num_attention_heads": 12, "num_key_value_heads": 8},
                {k: v for k, v in RELEASED.items() if k != "codebook_dim"}):
        with pytest.raises(ValueError):
            Code2WavConfig.from_dict(bad)


# --- parity ---------------------------------------------------------------------------------

def test_waveform_matches_qwen_tts_reference_and_perturbed_weight_does_not(reference, ours):
    codes = make_codes(PARITY_FRAMES, batch=2)
    with torch.no_grad():
        want = reference(codes)
        got = ours(codes)
    samples = PARITY_FRAMES * SAMPLES_PER_FRAME
    assert want.shape == (2, 1, samples) and got.shape == (2, samples)
    want = want.squeeze(1)
    diff = max_diff(got, want)
    clipped = (want.abs() >= 1).float().mean().item()
    print(f"qwen-tts parity: max-abs-diff {diff:.3g} (peak {want.abs().max():.3f}, "
          f"std {want.std():.3f}, clipped {clipped:.1%})")
    assert want.std() > 0.05 and clipped < 0.05, "weights should give a lively, mostly unclipped signal"
    assert diff <= 1e-4

    # Negative controls: one weight off in the last attention layer, and attention without
    # the 72-frame window (FRAMES > 72, so the window must matter).
    perturbed = copy.deepcopy(ours)
    windowless = Qwen3TTSCode2Wav(Code2WavConfig.from_dict({**TINY, "sliding_window": None}))
    windowless.load_state_dict(ours.state_dict())
    with torch.no_grad():
        perturbed.pre_transformer.layers[1].self_attn.v_proj.weight[0, 0] += 0.5
        off_weight = max_diff(perturbed(codes[:1]), want[:1])
        off_window = max_diff(windowless.eval()(codes[:1]), want[:1])
    print(f"negative controls: one weight +0.5 -> {off_weight:.3g}; no sliding window -> {off_window:.3g}")
    assert off_weight > 1e-2 and off_window > 1e-2


def test_chunked_decode_matches_reference_chunked_decode(reference, ours):
    """The reference tokenizer's decode path (chunked_decode: chunks with left context
    decoded whole, the context's samples dropped) == decode_streaming at the same sizes."""
    codes = make_codes(PARITY_FRAMES)
    with torch.no_grad():
        want = reference.chunked_decode(codes, chunk_size=40, left_context_size=25).squeeze(1)
        whole = ours(codes)
    got = decode_streaming(ours, codes, chunk_frames=40, left_context_frames=25)
    diff = max_diff(got, want)
    print(f"qwen-tts chunked_decode(40, 25) parity: max-abs-diff {diff:.3g}")
    assert diff <= 1e-4
    assert max_diff(got, whole) > 1e-2      # 25 frames of context are not exact


@pytest.fixture(scope="module")
def vllm_omni_tokenizer():
    """vLLM-Omni 0.30's copy of the tokenizer modeling file (its own SnakeBeta, mask cache
    and streaming paths; forward(codes) without caches is its exact decode)."""
    from tritontts.upstream import vllm_omni_module

    package = "vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz."
    try:
        context = vllm_omni_module(package + "modeling_qwen3_tts_tokenizer_v2")
        modeling = context.__enter__()
    except ImportError as exc:
        pytest.skip(f"vLLM-Omni's Qwen3-TTS tokenizer does not import here: {exc}")
    try:
        import importlib

        yield modeling, importlib.import_module(package + "configuration_qwen3_tts_tokenizer_v2")
    finally:
        context.__exit__(None, None, None)


def test_waveform_matches_vllm_omni_decoder_and_perturbed_weight_does_not(vllm_omni_tokenizer, ours):
    modeling, configuration = vllm_omni_tokenizer
    theirs = modeling.Qwen3TTSTokenizerV2Decoder(
        configuration.Qwen3TTSTokenizerV2DecoderConfig(**TINY)).eval()
    theirs.load_state_dict(ours.state_dict(), strict=True)
    codes = make_codes(PARITY_FRAMES)
    perturbed = copy.deepcopy(ours)
    with torch.no_grad():
        want = theirs(codes).squeeze(1)
        diff = max_diff(ours(codes), want)
        perturbed.quantizer.rvq_rest.output_proj.weight[0, 0, 0] += 0.5
        off = max_diff(perturbed(codes), want)
    print(f"vllm-omni parity: max-abs-diff {diff:.3g}; one weight +0.5 -> {off:.3g}")
    assert diff <= 1e-4 and off > 1e-2


# --- streaming ------------------------------------------------------------------------------

def test_plan_chunks_initial_then_steady_boundaries():
    assert plan_chunks(60, 25, 1) == [(0, 1), (1, 26), (26, 51), (51, 60)]
    # growing chunks (the served default): 1, 2, 4, 8, 16, then 25 each
    assert plan_chunks(60, 25, 1, growth=2) == [(0, 1), (1, 3), (3, 7), (7, 15), (15, 31),
                                                (31, 56), (56, 60)]
    assert plan_chunks(60, 25, 25) == plan_chunks(60, 25, 0) == [(0, 25), (25, 50), (50, 60)]
    assert plan_chunks(3, 25, 5) == [(0, 3)]
    assert plan_chunks(0, 25, 1) == []
    with pytest.raises(ValueError):
        plan_chunks(60, 25, 26)
    with pytest.raises(ValueError):
        plan_chunks(60, 25, 1, growth=1)


@pytest.mark.parametrize("initial_chunk_frames,growth", [(1, None), (25, None), (1, 2)])
def test_stream_with_exact_left_context_equals_whole_utterance(ours, whole, initial_chunk_frames, growth):
    context = ours.exact_left_context_frames
    assert context == 154                     # 10 + 2 layers * 71 + 2 < FRAMES
    streamed = decode_streaming(ours, make_codes(), 25, context, initial_chunk_frames, growth)
    peak = whole.abs().max().item()
    diff = max_diff(streamed, whole)
    print(f"stream (first chunk {initial_chunk_frames}, growth {growth}, context {context}) vs whole: "
          f"max-abs-diff {diff:.3g} (peak {peak:.3f})")
    assert diff <= 1e-4 * peak


@pytest.mark.parametrize("initial_chunk_frames", [1, 25])
def test_stream_with_72_frame_context_is_exact_only_while_windows_start_at_frame_0(
        ours, whole, initial_chunk_frames):
    """vLLM-Omni's default left context (72 frames, its sliding window) is less than the
    stacked windows reach: chunks whose window starts at frame 0 are exact, later ones are
    not. Also the negative control for the test above."""
    streamed = decode_streaming(ours, make_codes(), 25, 72, initial_chunk_frames)
    chunks = plan_chunks(FRAMES, 25, initial_chunk_frames)
    exact_until = max(end for start, end in chunks if start <= 72)
    per_frame = (streamed - whole).abs().view(FRAMES, SAMPLES_PER_FRAME).amax(dim=1)
    head, tail = per_frame[:exact_until].max().item(), per_frame[exact_until:].max().item()
    print(f"stream (first chunk {initial_chunk_frames}, context 72) vs whole: frames "
          f"<{exact_until} {head:.3g}, later frames {tail:.3g}")
    assert head <= 1e-4 * whole.abs().max().item()
    assert tail > 1e-2


def test_decode_chunk_is_window_decode_minus_context_samples(ours):
    """decode_chunk runs the upsampler on only the last N + conv_context_frames latents;
    the result must equal decoding the whole window and dropping L frames of samples, for
    any L (also below the exact context), and fail when L is misstated by one frame."""
    window = make_codes(PARITY_FRAMES, seed=5)
    with torch.no_grad():
        full = ours(window)
    for context in (0, 3, 10, 60, PARITY_FRAMES - 1):
        got = decode_chunk(ours, window, context)
        assert got.shape == (1, (PARITY_FRAMES - context) * SAMPLES_PER_FRAME)
        assert max_diff(got, full[:, context * SAMPLES_PER_FRAME:]) <= 1e-5, context
    shifted = decode_chunk(ours, window, 59)[:, SAMPLES_PER_FRAME:]
    assert max_diff(shifted, full[:, 60 * SAMPLES_PER_FRAME:]) <= 1e-5
    assert max_diff(decode_chunk(ours, window, 61), full[:, 60 * SAMPLES_PER_FRAME:-SAMPLES_PER_FRAME]) > 1e-2
    # The traced upsampler context (10 frames) is needed: with fewer latent frames the
    # kernels' outermost taps, chained through ~20 layers, reach the first samples (one
    # frame fewer: ~1e-6, too weak a path to assert on; fewer still: clearly).
    traced, errors = ours.conv_context_frames, {}
    for frames in (traced - 3, traced - 2, traced - 1, traced):
        short = copy.copy(ours)
        short.conv_context_frames = frames
        errors[frames] = max_diff(decode_chunk(short, window, 60), full[:, 60 * SAMPLES_PER_FRAME:])
    print("decode_chunk error by upsampler context frames:",
          ", ".join(f"{k}: {v:.3g}" for k, v in errors.items()))
    assert errors[traced] <= 1e-6 and errors[traced - 2] > 1e-4 and errors[traced - 3] > 1e-3
    with pytest.raises(ValueError):
        decode_chunk(ours, window, PARITY_FRAMES + 1)


# --- loader errors --------------------------------------------------------------------------

def test_loader_names_missing_key_and_missing_files(reference, tmp_path):
    state = dict(reference.state_dict())
    del state["pre_conv.conv.bias"]
    write_speech_tokenizer(tmp_path / "missing_key", state, TINY)
    with pytest.raises(CheckpointError, match=r"missing keys: pre_conv\.conv\.bias"):
        load_code2wav(tmp_path / "missing_key")

    state = dict(reference.state_dict())
    state["quantizer.rvq_rest.vq.layers.3._codebook.embedding_sum"] = torch.zeros(2048, 9)
    write_speech_tokenizer(tmp_path / "bad_shape", state, TINY)
    with pytest.raises(CheckpointError, match=r"rvq_rest\.vq\.layers\.3\._codebook\.embedding_sum"):
        load_code2wav(tmp_path / "bad_shape")

    for name in ("model.safetensors", "config.json"):
        folder = tmp_path / f"no_{name}"
        write_speech_tokenizer(folder, reference.state_dict(), TINY)
        (folder / name).unlink()
        with pytest.raises(CheckpointError, match=name.replace(".", r"\.")):
            load_code2wav(folder)

    folder = tmp_path / "garbled"
    write_speech_tokenizer(folder, reference.state_dict(), TINY)
    (folder / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        load_code2wav(folder)

    folder = tmp_path / "rate"
    write_speech_tokenizer(folder, reference.state_dict(), TINY, decode_upsample_rate=960)
    with pytest.raises(CheckpointError, match=r"config\.json.*decode_upsample_rate"):
        load_code2wav(folder)

    with pytest.raises(CheckpointError, match="not found"):
        load_code2wav(tmp_path / "nowhere")


def test_the_code2wav_stage_answers_the_final_chunk_of_a_stream_with_no_frame_with_no_audio(random_checkpoints):
    """A stop at the first frame or on a chunk boundary with no reference: the talker sends
    one zero frame, all context (Qwen3TTSTalkerStage.chunk); the response is valid and empty."""
    import numpy as np

    from tritontts.families import FAMILIES
    from tritontts.families.qwen3_tts.stages import Qwen3TTSCode2WavStage
    from tritontts.serving.stage import Inputs, StageContext

    checkpoint = FAMILIES["qwen3_tts"].open_checkpoint(random_checkpoints["qwen3_tts"])
    stage = Qwen3TTSCode2WavStage(StageContext("qwen3_tts_code2wav", checkpoint.root), checkpoint)
    result = stage.run(Inputs(codes=np.zeros((1, 16), np.int32), left_context=np.array([1]),
                              is_final=np.array([True])))
    assert result["audio"].size == 0


def test_the_code2wav_stage_decodes_a_batch_of_mixed_chunks_as_each_alone_and_fails_only_the_bad_one(
        random_checkpoints):
    """First chunks (no context) and later ones (left context), of two lengths, from
    several streams, in one batch Triton's dynamic batcher gathered: each equals its chunk
    decoded alone within 1e-5; a malformed request beside them fails alone."""
    import numpy as np

    from tritontts.families import FAMILIES
    from tritontts.families.qwen3_tts.stages import Qwen3TTSCode2WavStage
    from tritontts.protocol import InvalidRequest
    from tritontts.serving.stage import Inputs, StageContext

    checkpoint = FAMILIES["qwen3_tts"].open_checkpoint(random_checkpoints["qwen3_tts"])
    stage = Qwen3TTSCode2WavStage(StageContext("qwen3_tts_code2wav", checkpoint.root), checkpoint)
    rng = np.random.default_rng(0)
    codes = lambda frames: rng.integers(0, 1024, (frames, 16)).astype(np.int32)  # noqa: E731
    batch = [Inputs(codes=codes(4), left_context=np.array([0])),
             Inputs(codes=codes(9), left_context=np.array([5])),
             Inputs(codes=codes(4), left_context=np.array([0])),
             Inputs(codes=codes(3, ), left_context=np.array([7])),       # context beyond the window
             Inputs(codes=codes(9), left_context=np.array([5])),
             Inputs(codes=codes(12), left_context=np.array([8]))]
    together = stage.run_batch(batch)
    assert isinstance(together[3], InvalidRequest) and "left_context" in str(together[3])
    for i, result in enumerate(together):
        if i == 3:
            continue
        alone = stage.run(batch[i])["audio"]
        assert result["audio"].shape == alone.shape and alone.size > 0
        assert np.abs(result["audio"] - alone).max() <= 1e-5, i
    # the control: two different chunks decode differently
    assert np.abs(together[0]["audio"] - together[2]["audio"]).max() > 1e-3
