"""Reference implementations for numeric parity tests, from PyPI.

scripts/setup.sh unpacks `s3tokenizer` and `vllm-omni` into .venv/reference (on sys.path
through a .pth file) instead of installing them: vllm-omni registers a vLLM plugin that
breaks stock vLLM, and both pull torchaudio, which does not load beside this torch.
`placeholder_modules` stands in for imports that the exercised code paths never use.
"""
from __future__ import annotations

import sys
import types
from contextlib import contextmanager


@contextmanager
def placeholder_modules(*names: str):
    added = [n for n in names if n not in sys.modules]
    for name in added:
        sys.modules[name] = types.ModuleType(name)
    try:
        yield
    finally:
        for name in added:
            sys.modules.pop(name, None)


def s3tokenizer_utils():
    """s3tokenizer.utils (its log_mel_spectrogram uses torch only; torchaudio is for files)."""
    with placeholder_modules("torchaudio"):
        import s3tokenizer.utils as utils
    return utils


@contextmanager
def _package_module(package: str, subpackages: tuple[str, ...], name: str,
                    stand_ins: dict[str, dict]):
    """Import `name` from an unpacked reference package without running the __init__ of
    `package` or of `subpackages` (empty modules with the real __path__ stand in for them,
    so the files below load normally), with `stand_ins` (module name -> attributes) for
    imports whose code cannot load here. Everything is removed from sys.modules after."""
    import importlib
    import importlib.util

    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations, \
        f"{package} reference missing: run scripts/setup.sh"
    root = spec.submodule_search_locations[0]
    saved = {k: v for k, v in sys.modules.items() if k.split(".")[0] == package}
    for sub in ("", *subpackages):
        module = types.ModuleType(package + ("." + sub if sub else ""))
        module.__path__ = [root + ("/" + sub.replace(".", "/") if sub else "")]
        sys.modules[module.__name__] = module
    added = []
    for stand_in, attrs in stand_ins.items():
        if stand_in not in sys.modules:
            module = types.ModuleType(stand_in)
            module.__dict__.update(attrs)
            sys.modules[stand_in] = module
            added.append(stand_in)
    for stand_in in added:        # a stood-in submodule is also its parent's attribute
        parent, _, child = stand_in.rpartition(".")
        if parent in sys.modules:
            setattr(sys.modules[parent], child, sys.modules[stand_in])
    try:
        yield importlib.import_module(name)
    finally:
        for key in [k for k in sys.modules if k.split(".")[0] == package]:
            del sys.modules[key]
        sys.modules.update(saved)
        for stand_in in added:
            sys.modules.pop(stand_in, None)


@contextmanager
def vllm_omni_module(name: str, stand_ins: dict[str, dict] | None = None):
    """Import one vLLM-Omni 0.30 module without vllm_omni/__init__.py (which patches another
    vLLM version) or its model registry; `stand_ins` as in _package_module (e.g. torchaudio,
    which cannot load beside this torch)."""
    with _package_module("vllm_omni", ("model_executor", "model_executor.models"), name,
                         stand_ins or {}) as module:
        yield module


@contextmanager
def auk_module(name: str):
    """Import one module of vLLM-Omni 0.30's AuK diffusion package (`auk_transformer`,
    `auk_vae`: pure torch) without running the package inits above it: vllm_omni's, the
    diffusion registry's, and auk/__init__.py (which imports the pipeline, and with it
    torchaudio and the diffusion engine)."""
    with _package_module("vllm_omni", ("model_executor", "model_executor.models", "diffusion",
                                       "diffusion.models", "diffusion.models.auk"),
                         f"vllm_omni.diffusion.models.auk.{name}", {}) as module:
        yield module


def _librosa_mel(sr, n_fft, n_mels=128, fmin=0.0, fmax=None, **_):
    """librosa.filters.mel (Slaney scale and norm) from transformers' audio_utils, for
    reference code that imports librosa (not installed here)."""
    import numpy as np
    from transformers.audio_utils import mel_filter_bank

    return mel_filter_bank(n_fft // 2 + 1, n_mels, fmin, sr / 2 if fmax is None else fmax, sr,
                           norm="slaney", mel_scale="slaney").T.astype(np.float32)


@contextmanager
def qwen_tts_module(name: str):
    """Import one module of qwen-tts-compat 0.1.1.post1 (the Qwen3-TTS reference; setup
    unpacks it into .venv/reference) without its package __init__ (which loads the inference
    wrappers: sox, librosa, hub downloads). Stood in for while importing: the qwen_tts and
    qwen_tts.inference packages (empty, real __path__), qwen_tts.inference.qwen3_tts_tokenizer
    (only named at import time by the talker module), librosa.filters.mel (computed with
    transformers), sox and torchaudio (unused by the model code). Removed afterwards."""
    import transformers.audio_utils  # noqa: F401 - before any torchaudio stand-in exists

    stand_ins = {
        "librosa": {}, "librosa.filters": {"mel": _librosa_mel}, "sox": {},
        "qwen_tts.inference.qwen3_tts_tokenizer": {"Qwen3TTSTokenizer": type("Qwen3TTSTokenizer", (), {})},
    }
    with _package_module("qwen_tts", ("inference",), name, stand_ins) as module:
        yield module


@contextmanager
def omnivoice_module(name: str):
    """Import one module of omnivoice 0.2.1 (the OmniVoice reference; setup unpacks it into
    .venv/reference) without its package __init__ (which imports the CLI and training code).
    Stood in for while importing: torchaudio (resampling of files; tests pass 24 kHz audio)
    and pydub (silence trimming, which parity tests switch off). Removed afterwards."""
    import transformers  # noqa: F401 - before the torchaudio stand-in: transformers probes it
    import transformers.audio_utils  # noqa: F401
    from transformers import HiggsAudioV2TokenizerModel  # noqa: F401 - resolved before the stand-in

    silence = {"detect_leading_silence": None, "detect_nonsilent": None, "split_on_silence": None}
    stand_ins = {"torchaudio": {}, "pydub": {"AudioSegment": type("AudioSegment", (), {})},
                 "pydub.silence": silence}
    with _package_module("omnivoice", ("models", "utils"), name, stand_ins) as module:
        yield module


def glm_tts_dit_stand_ins() -> dict[str, dict]:
    """What vLLM-Omni's GLM-TTS DiT wrapper imports that cannot run here, for
    vllm_omni_module: their diffusion attention layer (it needs their runtime; the stand-in
    is plain SDPA on their [B, T, heads, dim] layout, what that layer computes unmasked;
    with a mask their DiT calls SDPA itself), the checkpoint resolver (handed the folder as
    it is: theirs may download) and their output template."""
    import types

    import torch

    class SdpaAttention(torch.nn.Module):
        def __init__(self, softmax_scale: float, **_) -> None:
            super().__init__()
            self.scale = softmax_scale

        def forward(self, q, k, v, attn_metadata=None):
            out = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=self.scale)
            return out.transpose(1, 2)

    return {"vllm_omni.diffusion.attention.layer": {"Attention": SdpaAttention},
            "vllm_omni.model_executor.models.glm_tts.glm_tts":
                {"resolve_glm_tts_model_dir": lambda path, **_: path},
            "vllm_omni.model_executor.models.output_templates": {"OmniOutput": types.SimpleNamespace}}


@contextmanager
def voxcpm_module(name: str):
    """Import one module of voxcpm 2.0.3 (the VoxCPM2 reference; setup unpacks it into
    .venv/reference) without the __init__ of voxcpm (the inference wrapper: torchaudio,
    librosa, hub downloads), voxcpm.modules or voxcpm.modules.audiovae (which imports both
    VAE versions). Removed from sys.modules afterwards."""
    with _package_module("voxcpm", ("modules", "modules.audiovae"), name, {}) as module:
        yield module


def voxcpm2_reference_model(root, dtype: str = "float32", audio_vae: bool = True):
    """voxcpm 2.0.3's VoxCPM2Model for the checkpoint at `root` (config.json, tokenizer,
    model.safetensors; with `audio_vae`, its AudioVAE v2 from audiovae.safetensors, else a
    stand-in with the sizes only), on the CPU in `dtype`, weights loaded. Its librosa is a
    stand-in whose `load` reads a file at the rate asked for (soundfile; no resampling):
    enough for _encode_wav on clips written at the VAE's input rate."""
    import json
    from pathlib import Path

    import soundfile as sf
    import torch
    from safetensors.torch import load_file
    from transformers import LlamaTokenizerFast

    def load(path, sr, mono=True):
        audio, rate = sf.read(str(path), dtype="float32")
        assert rate == sr, f"{path} is {rate} Hz; the stand-in reads only {sr} Hz files"
        return audio, rate

    root = Path(root)
    config = json.loads((root / "config.json").read_text())
    config["dtype"] = dtype
    if audio_vae:
        with voxcpm_module("voxcpm.modules.audiovae.audio_vae_v2") as vae_module:
            vae = vae_module.AudioVAE(vae_module.AudioVAEConfig(**config["audio_vae_config"]))
        vae.load_state_dict(load_file(str(root / "audiovae.safetensors")), strict=True)
        vae = vae.float().eval()
    else:
        vae = types.SimpleNamespace(chunk_size=640, sample_rate=16000, out_sample_rate=48000, latent_dim=64)
    with _package_module("voxcpm", ("modules", "model"), "voxcpm.model.voxcpm2", {"librosa": {"load": load}}) as m:
        model = m.VoxCPM2Model(m.VoxCPMConfig.model_validate(config),
                               LlamaTokenizerFast.from_pretrained(str(root)), vae, device="cpu")
    state = {k: v.to(getattr(torch, dtype)) for k, v in load_file(str(root / "model.safetensors")).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(k.startswith("audio_vae.") for k in missing), (missing, unexpected)
    return model.to(getattr(torch, dtype)).eval()


def voxtral_reference_talker(checkpoint, reorder: bool = True):
    """The Voxtral TTS talker's references on a checkpoint's weights, fp32: transformers'
    MistralModel on the backbone (wq / wk rows reordered for its rotate-half RoPE unless
    `reorder` is False: the negative control) and vLLM-Omni 0.30's
    FlowMatchingAudioTransformer on acoustic_transformer.*. Built on the meta device and
    filled a tensor at a time, each converted as it is read: a released-size checkpoint
    (bfloat16 on disk) then needs its float32 size and no more."""
    import json

    import torch
    from safetensors import safe_open
    from transformers import MistralConfig, MistralModel
    from transformers.models.mistral.modeling_mistral import MistralRotaryEmbedding

    from ..families.voxtral_tts.checkpoint import PARAMS_FILE, WEIGHTS_FILE
    from ..nn.llama_format import rotate_half_rows
    from ..families.voxtral_tts.talker import TEXT_EMBEDDINGS

    b = checkpoint.config.backbone
    config = MistralConfig(hidden_size=b.dim, intermediate_size=b.hidden_dim, num_hidden_layers=b.n_layers,
                           num_attention_heads=b.n_heads, num_key_value_heads=b.n_kv_heads, head_dim=b.head_dim,
                           rms_norm_eps=b.norm_eps, rope_theta=b.rope_theta, vocab_size=b.vocab_size,
                           tie_word_embeddings=True, max_position_embeddings=b.max_seq_len)
    names = {TEXT_EMBEDDINGS: "embed_tokens.weight", "norm.weight": "norm.weight"}
    rows = {}
    for i in range(b.n_layers):
        p, q = f"layers.{i}.", f"layers.{i}."
        names.update({p + "attention.wq.weight": q + "self_attn.q_proj.weight",
                      p + "attention.wk.weight": q + "self_attn.k_proj.weight",
                      p + "attention.wv.weight": q + "self_attn.v_proj.weight",
                      p + "attention.wo.weight": q + "self_attn.o_proj.weight",
                      p + "feed_forward.w1.weight": q + "mlp.gate_proj.weight",
                      p + "feed_forward.w3.weight": q + "mlp.up_proj.weight",
                      p + "feed_forward.w2.weight": q + "mlp.down_proj.weight",
                      p + "attention_norm.weight": q + "input_layernorm.weight",
                      p + "ffn_norm.weight": q + "post_attention_layernorm.weight"})
        if reorder:
            rows.update({p + "attention.wq.weight": b.n_heads, p + "attention.wk.weight": b.n_kv_heads})
    with torch.device("meta"):
        backbone = MistralModel(config)
    # The acoustic transformer (a few hundred MB) is built as it is: its constructor
    # computes buffers (the time grid, the time embedding's frequencies).
    audio_args = json.loads(checkpoint.path(PARAMS_FILE).read_text())["multimodal"]["audio_model_args"]
    with vllm_omni_module("vllm_omni.model_executor.models.voxtral_tts.voxtral_tts_audio_generation") as m:
        acoustic = m.FlowMatchingAudioTransformer(audio_args)
    hf, ref = {}, {}
    with safe_open(str(checkpoint.path(WEIGHTS_FILE)), framework="pt", device="cpu") as f:
        for name in f.keys():
            if name in names:
                tensor = f.get_tensor(name).float()
                hf[names[name]] = rotate_half_rows(tensor, rows[name]) if name in rows else tensor
            elif name.startswith("acoustic_transformer."):
                ref[name[len("acoustic_transformer."):]] = f.get_tensor(name).float()
    backbone.load_state_dict(hf, strict=True, assign=True)
    backbone.rotary_emb = MistralRotaryEmbedding(config)          # a buffer, not in the file
    missing, unexpected = acoustic.load_state_dict(ref, strict=False)
    assert not unexpected and set(missing) <= {"time_embedding.inv_freq"}, (missing, unexpected)
    return backbone.float().eval(), acoustic.float().eval()


def voxtral_reference_frames(backbone, acoustic, embed_frames, prompt, frames: int, cfg: float = 1.2):
    """The reference talker loop: frames [B, frames, 37] (shifted codes) for prompt
    embeddings [B, T, dim] from `voxtral_reference_talker`'s modules: transformers' KV cache
    (prefill, then one position a step), vLLM-Omni's FlowMatchingAudioTransformer per frame
    (its own noise, from torch's global generator), the frame's summed codebook embeddings
    as the next input (`embed_frames`: ours, tritontts.families.voxtral_tts.talker.FrameEmbeddings;
    upstream's are vLLM layers). Rows go on past an END_AUDIO frame (a batch runs in step);
    the caller cuts them there."""
    import torch
    from transformers import DynamicCache

    cache, out, x = DynamicCache(), [], prompt
    cfg_rows = torch.full((prompt.shape[0],), float(cfg))
    with torch.no_grad():
        for _ in range(frames):
            hidden = backbone(inputs_embeds=x, past_key_values=cache, use_cache=True).last_hidden_state[:, -1]
            codes = acoustic(hidden, cfg_rows)
            out.append(codes)
            x = embed_frames(codes)[:, None]
    return torch.stack(out, dim=1)


# vLLM-Omni's Gepard talker imports vLLM's qwen3_5 module, which needs torchvision (not
# loadable here); the reference code exercised (the heads' sampling and the frame embedding)
# never touches the backbone class it names.
GEPARD_STAND_INS = {"vllm.model_executor.models.qwen3_5": {"Qwen3_5ForCausalLM": None}}


def gepard_reference_talker(checkpoint):
    """Gepard's references on a checkpoint's weights, fp32: transformers' Qwen3_5ForCausalLM
    on model.* and lm_head (its torch Gated-DeltaNet fallback), and vLLM-Omni 0.30's
    GepardTalkerForConditionalGeneration holding the heads (its codebook heads fused as its
    own load_weights fuses them), used for its _sample_frame / _audio_frame_embed; its
    backbone and codec are never built. Tensors are read one at a time, converted as read."""
    import torch
    from safetensors import safe_open
    from torch import nn
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    c = checkpoint.config
    fields = {k: v for k, v in checkpoint.backbone_dict.items()
              if k not in ("architectures", "model_type", "torch_dtype", "transformers_version")}
    with torch.device("meta"):
        backbone = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**fields))
    hf, heads = {}, {}
    for path in checkpoint.weight_files:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                (hf if name.startswith(("model.", "lm_head.")) else heads)[name] = f.get_tensor(name).float()
    backbone.load_state_dict(hf, strict=True, assign=True)
    backbone.model.rotary_emb = type(backbone.model.rotary_emb)(backbone.config)   # a buffer, not in the file
    with vllm_omni_module("vllm_omni.model_executor.models.gepard.gepard_talker", GEPARD_STAND_INS) as m:
        cls = m.GepardTalkerForConditionalGeneration
        omni = cls.__new__(cls)
        nn.Module.__init__(omni)
    hidden, levels = c.backbone.hidden_size, list(c.head_levels)
    omni.vocab_sizes, omni.num_heads, omni.head0_vocab = levels, len(levels), levels[0]
    omni.temperature, omni.stop_threshold, omni._greedy = c.temperature, c.stop_threshold, False
    omni.fused_codebook_head = nn.Linear(hidden, sum(levels))
    omni.fused_codebook_head.weight.data = torch.cat([heads[f"codebook_heads.{i}.weight"] for i in range(len(levels))])
    omni.fused_codebook_head.bias.data = torch.cat([heads[f"codebook_heads.{i}.bias"] for i in range(len(levels))])
    omni.stop_head = nn.Linear(hidden, 1)
    omni.audio_embeddings = nn.ModuleList(nn.Embedding(n, c.audio_embed_dim) for n in levels)
    omni.audio_embed_proj = nn.Sequential(nn.Linear(len(levels) * c.audio_embed_dim, hidden), nn.GELU(),
                                          nn.Linear(hidden, hidden), nn.LayerNorm(hidden, elementwise_affine=False))
    omni.register_buffer("audio_embed_scale", heads.get("audio_embed_scale", torch.tensor(1.0)))
    omni.null_prefix = nn.Parameter(heads["null_prefix"])
    gather, mask = cls._build_gather_mask(levels)
    omni.register_buffer("_cb_gather_idx", gather, persistent=False)
    omni.register_buffer("_cb_mask", mask, persistent=False)
    state = {k: v for k, v in heads.items() if k.startswith(("stop_head.", "audio_embeddings.", "audio_embed_proj."))}
    missing, unexpected = omni.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"fused_codebook_head.weight", "fused_codebook_head.bias",
                                               "null_prefix", "audio_embed_scale"}, (missing, unexpected)
    return backbone.float().eval(), omni.float().eval()


def gepard_reference_frames(backbone, omni, config, prompt_ids: list[int], seed: int, max_frames: int):
    """The reference talker loop for one request: frames [n, 32] until the stop head fires
    (from the second frame on, as vLLM-Omni lets it) or max_frames. Prompt embeddings with
    null_prefix at the speaker slots; transformers' cache (prefill, then one position a
    step); each frame drawn by vLLM-Omni's _sample_frame from a generator seeded `seed`; the
    next input its _audio_frame_embed."""
    import torch
    from transformers import DynamicCache

    ids = torch.tensor(prompt_ids)
    embeds = backbone.model.embed_tokens(ids)
    slot = (ids >= config.speaker_base) & (ids < config.speaker_base + config.speaker_slots)
    embeds[slot] = omni.null_prefix[ids[slot] - config.speaker_base]
    generator = torch.Generator().manual_seed(seed)
    cache, frames, x = DynamicCache(config=backbone.config), [], embeds[None]
    with torch.no_grad():
        while len(frames) < max_frames:
            hidden = backbone.model(inputs_embeds=x, past_key_values=cache, use_cache=True).last_hidden_state[:, -1]
            head0, rest, stop = omni._sample_frame(hidden, [generator])
            if bool(stop[0]) and frames:
                break
            frames.append(torch.cat([head0, rest[0]]))
            x = omni._audio_frame_embed(head0, rest)[:, None]
    return torch.stack(frames)


def auk_fused_condition(hidden_states, layer_weights, layer_scale: float):
    """AuK's upstream read-out of a transformers thinker's `hidden_states` (embeddings first,
    then every layer's output, the last after the final norm): layers 1.. layer-normed
    without affine, mixed by softmax(layer_weights), times layer_scale -> [T, hidden]."""
    import torch
    import torch.nn.functional as F

    hidden = torch.stack(tuple(hidden_states[1:]), dim=0)[:, 0]
    mix = torch.softmax(torch.as_tensor(layer_weights, dtype=torch.float32), dim=0)
    return (F.layer_norm(hidden, hidden.shape[-1:]) * mix[:, None, None]).sum(0) * layer_scale


def auk_reference_audio(root, instruction: str, frames: int, seed: int, t_grid=None, nfe: int = 32,
                        cfg: float = 2.0, sway: float | None = -1.0, clip24k=None, vae_sample: bool = False):
    """AuK end to end by the references, fp32, on a checkpoint folder: transformers'
    Qwen2_5OmniThinkerForConditionalGeneration (its processor's Whisper features for the clip,
    its own audio tower and mRoPE) over the rendered prompt tokenized whole, its hidden states
    fused by the upstream rule; vLLM-Omni 0.30's sample_latents with its AuKTransformer
    (noise from a generator seeded with `seed`) and its AuKVAE (the clip encoded, the latents
    decoded). The clip goes in at 24 kHz; its 16 kHz copy is resampled as the stage does.
    Returns the waveform [frames * 480]."""
    import numpy as np
    import torch
    from safetensors.torch import load_file
    from transformers import WhisperFeatureExtractor
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniThinkerConfig
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniThinkerForConditionalGeneration

    from ..audio import resample
    from ..families.auk.checkpoint import open_checkpoint
    from ..families.auk.prompt import PromptBuilder, rendered

    ckpt = open_checkpoint(root)
    with auk_module("auk_vae") as vae_module:
        vae = vae_module.AuKVAE.from_config(ckpt.vae)
        vae.load_weights(str(ckpt.vae_file))
        vae.eval()
    with auk_module("auk_transformer") as dit_module:
        dit = dit_module.AuKTransformer(**ckpt.dit)
        dit.load_state_dict(dit_module.dit_state_dict(load_file(str(ckpt.weights_file))), strict=True)
        dit.eval()
        sample_latents = dit_module.sample_latents

    config = Qwen2_5OmniThinkerConfig(**ckpt.thinker_config)
    config._attn_implementation = "eager"
    thinker = Qwen2_5OmniThinkerForConditionalGeneration(config).eval()
    state = {}
    for f in ckpt.thinker_files:
        state.update({k[len("thinker."):]: v for k, v in load_file(str(f)).items() if k.startswith("thinker.")})
    thinker.load_state_dict(state, strict=False)
    tokenizer = PromptBuilder(ckpt.thinker_root).tokenizer
    kwargs, ref = {}, torch.zeros(1, 0, ckpt.latent_dim)
    audio_tokens = 0
    with torch.no_grad():
        if clip24k is not None:
            clip16k = resample(np.asarray(clip24k, np.float32), ckpt.sample_rate, 16000)
            extractor = WhisperFeatureExtractor(feature_size=128, sampling_rate=16000, hop_length=160,
                                                chunk_length=300, n_fft=400)
            feats = extractor(clip16k, sampling_rate=16000, padding="max_length", return_attention_mask=True,
                              return_tensors="pt")
            mask = feats["attention_mask"]
            kwargs = {"input_features": feats["input_features"], "feature_attention_mask": mask}
            length = int(mask.sum())
            audio_tokens = ((length - 1) // 2 + 1 - 2) // 2 + 1
            wav = torch.from_numpy(np.asarray(clip24k, np.float32))
            wav = wav[: wav.shape[0] // ckpt.hop * ckpt.hop][None]
            generator = torch.Generator().manual_seed((seed + 0x5EED_0A0C) % 2**63) if vae_sample else None
            ref = vae.encode(wav, sample=vae_sample, generator=generator)
        ids = tokenizer(rendered(instruction, audio_tokens), add_special_tokens=False)["input_ids"]
        out = thinker(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                      output_hidden_states=True, use_cache=False, **kwargs)
        cond = auk_fused_condition(out.hidden_states, *ckpt.read_fusion())
        latents = sample_latents(dit, text=cond[None], c_mask=torch.ones(1, cond.shape[0], dtype=torch.bool),
                                 ref=ref, ref_mask=torch.ones(ref.shape[:2], dtype=torch.bool), gen_frames=frames,
                                 nfe=nfe, cfg_strength=cfg, sway_sampling_coef=sway,
                                 t_grid=None if t_grid is None else list(t_grid),
                                 generator=torch.Generator().manual_seed(seed), latent_dim=ckpt.latent_dim,
                                 device="cpu", dtype=torch.float32)
        return vae.decode(latents.float())[0].numpy()
