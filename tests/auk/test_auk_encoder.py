"""AuK's condition encoder on vLLM (tritontts.families.auk.vllm_model: vLLM's Qwen2 layers, the clip's
audio-tower embeddings at the <|AUDIO|> places, every layer fused) against transformers'
Qwen2_5OmniThinkerForConditionalGeneration on the same tiny checkpoint, fp32: its
hidden_states fused by the upstream rule (layer_norm of hidden_states[1:], softmax(
layer_weights)-weighted sum, times layer_scale). The reference computes its own multimodal
RoPE positions and its own audio tower, so equal conditions also show that 1-D RoPE is exact
for text and audio, and that our audio tower is placed where Qwen2.5-Omni places it."""
from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from tritontts.families.auk.checkpoint import open_checkpoint
from tritontts.families.auk.prompt import IM_END, PromptBuilder, rendered
from tritontts.families.auk.random_checkpoint import write_random_checkpoint
from tritontts.testing.engine import close_engine, frames_engine
from tritontts.families.auk.upstream import auk_fused_condition

INSTRUCTIONS = ('Generate speech based on the following description: "A clear, natural voice.". '
                'The content to speak is: "Hello there, how are you today?".',
                "Add rain to the recording.", "A dog barks twice.")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return open_checkpoint(write_random_checkpoint(tmp_path_factory.mktemp("auk") / "tiny", seed=3))


@pytest.fixture(scope="module")
def clip():
    t = np.arange(int(2.3 * 16000)) / 16000
    return (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype(np.float32)


@pytest.fixture(scope="module")
def reference(checkpoint):
    from safetensors.torch import load_file
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniThinkerConfig
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniThinkerForConditionalGeneration

    config = Qwen2_5OmniThinkerConfig(**checkpoint.thinker_config)
    config._attn_implementation = "eager"
    model = Qwen2_5OmniThinkerForConditionalGeneration(config).eval()
    state = {k[len("thinker."):]: v for k, v in load_file(str(checkpoint.thinker_files[0])).items()
             if k.startswith("thinker.")}
    model.load_state_dict(state, strict=True)
    return model


def reference_condition(model, checkpoint, ids, features=None, layer_weights=None):
    kwargs = {}
    if features is not None:
        kwargs = {"input_features": features[None], "feature_attention_mask": torch.ones(1, features.shape[1],
                                                                                         dtype=torch.long)}
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                    output_hidden_states=True, use_cache=False, **kwargs)
    weights, scale = checkpoint.read_fusion()
    return auk_fused_condition(out.hidden_states, weights if layer_weights is None else layer_weights, scale)


@pytest.fixture(scope="module")
def encoder(checkpoint, tmp_path_factory):
    from tritontts.families.auk.vllm_model import prepare_vllm_encoder, register

    builder = PromptBuilder(checkpoint.thinker_root)
    register()
    folder = prepare_vllm_encoder(checkpoint, builder.special[IM_END], tmp_path_factory.mktemp("cache"))
    # 16-token steps: every prompt here is prefilled in chunks (rows are written by position),
    # and the batch's requests share steps.
    llm = frames_engine(folder, 64 * 2**20, max_model_len=1024, max_num_batched_tokens=16,
                        enable_chunked_prefill=True)
    yield builder, llm
    close_engine(llm)
    del llm
    gc.collect()


def run_encoder(llm, prompts):
    """prompts: [(ids, audio_start, audio_embeds | None)] -> their conditions, run as one batch."""
    from vllm import SamplingParams, TokensPrompt

    from tritontts.families.auk.vllm_model import EncoderRequest
    from tritontts.engine.vllm_frames import FRAMES_ARG, register, release

    requests, params = [], []
    for i, (ids, start, embeds) in enumerate(prompts):
        request = EncoderRequest(len(ids), start, embeds)
        register(f"enc-{i}", request)
        requests.append(request)
        params.append(SamplingParams(max_tokens=1, temperature=0.0, detokenize=False,
                                     extra_args={FRAMES_ARG: f"enc-{i}"}))
    try:
        llm.generate([TokensPrompt(prompt_token_ids=ids) for ids, _, _ in prompts], params, use_tqdm=False)
        return [r.take() for r in requests]
    finally:
        for i in range(len(prompts)):
            release(f"enc-{i}")


def test_prompt_ids_equal_the_rendered_template_tokenized_whole(checkpoint):
    builder = PromptBuilder(checkpoint.thinker_root)
    for instruction, audio in ((INSTRUCTIONS[0], 0), (INSTRUCTIONS[1], 7)):
        ours = builder(instruction, audio)
        whole = builder.tokenizer(rendered(instruction, audio), add_special_tokens=False)["input_ids"]
        assert ours.ids == list(whole)
        if audio:
            audio_id = builder.special["<|AUDIO|>"]
            assert ours.ids[ours.audio_start:ours.audio_start + audio] == [audio_id] * audio
            assert ours.ids.count(audio_id) == audio
    # Special tokens typed by a user stay text: they cannot open a turn or add audio places.
    typed = builder("say <|im_end|> and <|AUDIO|>", 0)
    assert typed.ids.count(builder.special["<|AUDIO|>"]) == 0
    assert typed.ids.count(builder.special[IM_END]) == 2


def test_vllm_condition_equals_the_transformers_thinker_fused_for_batched_chunked_requests(checkpoint, reference,
                                                                                   encoder, clip):
    from tritontts.families.auk.audio_tower import audio_features, load_audio_tower
    from tritontts.weights.checkpoint import read_tensors

    builder, llm = encoder
    tower = load_audio_tower(read_tensors(checkpoint.thinker_files[0], "thinker.audio_tower."),
                             checkpoint.audio_config)
    features = audio_features(clip)
    with torch.no_grad():
        embeds = tower(features)
    with_clip = builder(INSTRUCTIONS[1], embeds.shape[0])
    plain = [builder(text) for text in (INSTRUCTIONS[0], INSTRUCTIONS[2])]
    assert min(len(with_clip.ids), *(len(p.ids) for p in plain)) > 16
    ours = run_encoder(llm, [(with_clip.ids, with_clip.audio_start, embeds)]
                       + [(p.ids, p.audio_start, None) for p in plain])
    expected = [reference_condition(reference, checkpoint, with_clip.ids, features)] + [
        reference_condition(reference, checkpoint, p.ids) for p in plain]
    diffs = [float((o - e).abs().max()) for o, e in zip(ours, expected)]
    print(f"condition max-abs-diff vs transformers (clip, text, text): {diffs}; "
          f"peak {float(expected[0].abs().max()):.3f}")
    assert all(o.shape == e.shape for o, e in zip(ours, expected))
    assert max(diffs) < 1e-4
    # Negative controls: other fusion weights; the clip left out of the reference.
    weights, _ = checkpoint.read_fusion()
    other = reference_condition(reference, checkpoint, plain[0].ids, layer_weights=[w * -1.0 for w in weights])
    assert float((ours[1] - other).abs().max()) > 1e-2
    without_clip = reference_condition(reference, checkpoint, with_clip.ids)
    assert float((ours[0] - without_clip).abs().max()) > 1e-2
