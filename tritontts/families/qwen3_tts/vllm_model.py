"""The Qwen3-TTS talker as an out-of-tree vLLM model (tritontts.engine.vllm_frames explains the
mechanism every per-frame talker shares).

vLLM runs the Qwen3 backbone (its own attention, KV cache, continuous batching) with the
codec table as its token embedding and codec_head as its LM head, so vLLM samples
codebook 0. Inside each forward, rows whose newest token is a freshly sampled codebook 0
get the rest of their frame from our code predictor (tritontts.families.qwen3_tts.talker, the same
module the parity tests check against the reference), batched across those rows; the
frame's summed embedding plus the step's text embedding is that position's input.

The model folder vLLM loads is made by `prepare_vllm_talker`: a config.json for vLLM (a
Qwen3 backbone config naming this architecture, the predictor's shape beside it) and a link
to the checkpoint's model.safetensors; load_weights takes the talker's tensors and skips
the rest (text tables, speaker encoder), so nothing is converted or copied.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

from ...weights.checkpoint import engine_folder
from ...engine.vllm_frames import FrameStream, FrameTalker
from .checkpoint import TALKER_PREFIX, WEIGHTS_FILE, DecoderShape, Qwen3TTSCheckpoint
from .talker import CodePredictor, TopKTopPSampler, greedy, predict_frame
from ...engine.vllm_talker import register_vllm_model

ARCHITECTURE = "Qwen3TTSTalkerForVllm"
MODEL_CLASS = f"{__name__}:{ARCHITECTURE}"
PREDICTOR_KEY = "tritontts_code_predictor"   # config.json: the code predictor's DecoderShape


def register() -> None:
    """Make the architecture known to vLLM (lazily: the class is imported in the engine)."""
    register_vllm_model(ARCHITECTURE, MODEL_CLASS)


def prepare_vllm_talker(checkpoint: Qwen3TTSCheckpoint, cache_root: str | Path | None = None) -> Path:
    """The folder vLLM loads for this checkpoint's talker (made once, keyed by the
    checkpoint's path and weights' size and mtime)."""
    t = checkpoint.config.talker
    config = {
        "architectures": [ARCHITECTURE], "model_type": "qwen3",
        "vocab_size": t.vocab_size, "hidden_size": t.hidden_size,
        "intermediate_size": t.intermediate_size, "num_hidden_layers": t.num_hidden_layers,
        "num_attention_heads": t.num_attention_heads, "num_key_value_heads": t.num_key_value_heads,
        "head_dim": t.head_dim, "rms_norm_eps": t.rms_norm_eps, "hidden_act": "silu",
        # The reference's multimodal RoPE is exactly 1-D RoPE for TTS (talker.py, docstring).
        "rope_theta": t.rope_theta, "rope_scaling": None,
        "max_position_embeddings": t.max_position_embeddings, "attention_bias": t.attention_bias,
        "tie_word_embeddings": False, "torch_dtype": "float32",
        "bos_token_id": t.codec_bos_id, "eos_token_id": t.codec_eos_token_id,
        "num_code_groups": t.num_code_groups,
        PREDICTOR_KEY: asdict(t.code_predictor),
    }

    return engine_folder("qwen3-tts-talker", [checkpoint.path(WEIGHTS_FILE)], config, cache_root_dir=cache_root)


class Qwen3TTSTalkerForVllm(nn.Module, FrameTalker):
    def __init__(self, *, vllm_config, prefix: str = ""):
        from vllm.model_executor.layers.logits_processor import LogitsProcessor
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
        from vllm.model_executor.models.qwen3 import Qwen3Model
        from vllm.model_executor.models.utils import maybe_prefix

        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        self.model = Qwen3Model(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size,
                                      prefix=maybe_prefix(prefix, "lm_head"))
        self.logits_processor = LogitsProcessor(config.vocab_size)
        shape = DecoderShape(**getattr(config, PREDICTOR_KEY))
        self.code_predictor = CodePredictor(shape, config.hidden_size)

    # FrameTalker -------------------------------------------------------------------------

    def embed_token(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(ids)

    def embed_frames(self, codes: torch.Tensor) -> torch.Tensor:
        total = self.model.embed_input_ids(codes[:, 0])
        for i, table in enumerate(self.code_predictor.model.codec_embedding):
            total = total + table(codes[:, i + 1])
        return total

    def predict_frames(self, hidden: torch.Tensor, tokens: torch.Tensor,
                       streams: list[FrameStream]) -> torch.Tensor:
        samplers = [_sampler(s) for s in streams]

        def per_row(logits: torch.Tensor, step: int) -> torch.Tensor:
            return torch.cat([samplers[r](logits[r:r + 1], step) for r in range(logits.shape[0])])

        return predict_frame(self.code_predictor, hidden, tokens, self.embed_token(tokens), per_row)

    # vLLM model interface ----------------------------------------------------------------

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        with torch.no_grad():
            embeds = self.frame_inputs(input_ids, positions)
        hidden = self.model(None, positions, intermediate_tensors, embeds)
        self.stash_hidden(hidden, positions)
        return hidden

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The checkpoint's talker.* tensors: the backbone through vLLM's own loader (it
        fuses q/k/v and gate/up), the rest into our modules; text tables and the speaker
        encoder are the prompt stage's, not ours."""
        backbone, predictor, loaded = [], {}, set()
        for name, tensor in weights:
            if not name.startswith(TALKER_PREFIX):
                continue
            name = name[len(TALKER_PREFIX):]
            if name == "model.codec_embedding.weight":
                backbone.append(("embed_tokens.weight", tensor))
            elif name.startswith("model.layers.") or name == "model.norm.weight":
                backbone.append((name[len("model."):], tensor))
            elif name == "codec_head.weight":
                self.lm_head.weight.data.copy_(tensor)
                loaded.add("lm_head.weight")
            elif name.startswith("code_predictor."):
                predictor[name[len("code_predictor."):]] = tensor
        loaded |= {f"model.{n}" for n in self.model.load_weights(backbone)}
        from ...weights.checkpoint import load_strict

        load_strict(self.code_predictor, predictor, "talker.code_predictor")
        loaded |= {f"code_predictor.{n}" for n in self.code_predictor.state_dict()}
        return loaded


def _sampler(stream: FrameStream):
    s = stream.sampling
    if not s.get("do_sample", True):
        return greedy
    return TopKTopPSampler(s.get("temperature", 0.9), s.get("top_k", 50), s.get("top_p", 1.0),
                           stream.generator)
