"""Voxtral TTS's PyTorch talker: the backbone on Mistral-format weights (interleaved RoPE)
equals transformers' MistralForCausalLM given the same weights with wq/wk rows reordered for
its rotate-half RoPE (without the reordering it differs: the negative control); the prompt
for a preset voice puts the voice's rows at the [AUDIO] positions of mistral-common's
layout; a seeded generation is reproducible and its frames are valid codes."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from tritontts.families.voxtral_tts.upstream import voxtral_upstream_frames, voxtral_upstream_talker
from tritontts.families.voxtral_tts.checkpoint import open_checkpoint
from tritontts.families.voxtral_tts.random_checkpoint import write_random_checkpoint
from tritontts.families.voxtral_tts.talker import VoxtralTalker, talker_state


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    root = write_random_checkpoint(tmp_path_factory.mktemp("voxtral") / "tiny", seed=2)
    ckpt = open_checkpoint(root)
    state = load_file(str(root / "consolidated.safetensors"))
    talker = VoxtralTalker(ckpt.config)
    talker.load_state_dict(talker_state(state), strict=True)
    return ckpt, state, talker.eval()


def test_backbone_matches_transformers_mistral_with_reordered_rows(loaded):
    ckpt, state, talker = loaded
    ids = torch.randint(100, ckpt.config.backbone.vocab_size, (2, 23), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = talker.hidden(talker.tok_embeddings(ids))
        want = voxtral_upstream_talker(ckpt)[0](input_ids=ids).last_hidden_state
        plain = voxtral_upstream_talker(ckpt, reorder=False)[0](input_ids=ids).last_hidden_state
    diff = (ours - want).abs().max().item()
    print(f"backbone hidden max-abs-diff {diff:.2e}; without the row reordering {(ours - plain).abs().max():.2e}")
    assert diff < 1e-4
    assert (ours - plain).abs().max() > 1e-2


def speech_ids(ckpt, text: str, voice: str) -> torch.Tensor:
    from mistral_common.protocol.speech.request import SpeechRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    tokenizer = MistralTokenizer.from_file(str(ckpt.path("tekken.json")))
    return torch.tensor(tokenizer.instruct_tokenizer.encode_speech_request(SpeechRequest(input=text, voice=voice)).tokens)


def test_voice_rows_take_the_audio_positions(loaded):
    ckpt, _, talker = loaded
    ids = speech_ids(ckpt, "Hello there.", "casual_male")
    voice = ckpt.voice_embedding("casual_male")
    with torch.no_grad():
        embeds = talker.prompt_embeds(ids, voice)
    audio = ids == 24
    assert torch.equal(embeds[audio], voice) and torch.equal(embeds[~audio], talker.tok_embeddings(ids[~audio]))
    with pytest.raises(ValueError, match="6 rows"):
        talker.prompt_embeds(speech_ids(ckpt, "Hi.", "neutral_female"), voice)


def test_seeded_generation_is_reproducible_and_gives_valid_codes(loaded):
    ckpt, _, talker = loaded
    with torch.no_grad():
        prompt = talker.prompt_embeds(speech_ids(ckpt, "Hello there.", "casual_male"), ckpt.voice_embedding("casual_male"))

    def run(seed):
        gen = torch.Generator().manual_seed(seed)
        return talker.generate(prompt, lambda: torch.randn(1, 36, generator=gen), max_frames=8)

    a, b, other = run(3), run(3), run(4)
    print("frames", a.shape[0], "semantic", a[:, 0].tolist())
    assert torch.equal(a, b) and a.shape[1] == 37
    assert ((a[:, 0] >= 2) & (a[:, 0] < 2 + 64)).all() and ((a[:, 1:] >= 2) & (a[:, 1:] <= 22)).all()
    # Another seed: the first frame's acoustic codes (drawn from its noise) differ.
    assert a.shape[0] > 0 and not torch.equal(a[0, 1:], other[0, 1:])


def test_generate_equals_the_reference_loop_with_the_same_noise(loaded):
    """Our talker's generate (whole sequence each step, our acoustic transformer) against the
    reference loop (transformers' KV cache + vLLM-Omni's FlowMatchingAudioTransformer drawing
    its own noise) from the same global seed; another seed as the negative control."""
    from tritontts.families.voxtral_tts.acoustic import END_AUDIO

    ckpt, _, talker = loaded
    backbone, acoustic = voxtral_upstream_talker(ckpt)
    ids = speech_ids(ckpt, "Hello there, how are you today?", "neutral_female")
    with torch.no_grad():
        prompt = talker.prompt_embeds(ids, ckpt.voice_embedding("neutral_female"))
    torch.manual_seed(5)
    want = voxtral_upstream_frames(backbone, acoustic, talker.embed_frames, prompt[None], 10)[0]
    ended = (want[:, 0] == END_AUDIO).nonzero()
    want = want[:int(ended[0])] if len(ended) else want
    torch.manual_seed(5)
    got = talker.generate(prompt, lambda: torch.randn(1, 36), 10)
    torch.manual_seed(6)
    other = talker.generate(prompt, lambda: torch.randn(1, 36), 10)
    print(f"{got.shape[0]} frames, reference {want.shape[0]}; another seed equal: {torch.equal(other, got)}")
    assert got.shape[0] >= 3 and torch.equal(got, want)
    assert not torch.equal(other, got)
