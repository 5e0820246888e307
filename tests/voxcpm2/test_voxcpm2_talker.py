"""VoxCPM2's talker and prompt against voxcpm 2.0.3 (VoxCPM2Model.generate, fp32, the same
random checkpoint and the same noise: both draw each step's noise from the global RNG):
the prompt sequences of every cloning mode, the generated patches and the decoded audio;
a different cfg value as the negative control. Also the tokenizer's CJK splitting."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import soundfile as sf
import torch

from tritontts.families.voxcpm2.audio_vae import AudioVAEConfig, load_audio_vae
from tritontts.families.voxcpm2.checkpoint import open_checkpoint
from tritontts.families.voxcpm2.prompt import TextTokenizer, build_prompt, encode_patches, max_steps
from tritontts.families.voxcpm2.random_checkpoint import write_random_checkpoint
from tritontts.families.voxcpm2.talker import load_talker

TEXT = "Hello there, how are you today?"
PROMPT_TEXT = "This is the reference voice."


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_random_checkpoint(tmp_path_factory.mktemp("voxcpm2") / "tiny", seed=1)


@pytest.fixture(scope="module")
def ours(ckpt):
    checkpoint = open_checkpoint(ckpt)
    vae = load_audio_vae(ckpt / "audiovae.safetensors", AudioVAEConfig.from_dict(checkpoint.config.audio_vae))
    return checkpoint, load_talker(checkpoint), vae, TextTokenizer(ckpt)


@pytest.fixture(scope="module")
def upstream(ckpt):
    from tritontts.families.voxcpm2.upstream import voxcpm2_upstream_model

    return voxcpm2_upstream_model(ckpt)


@pytest.fixture(scope="module")
def clip(tmp_path_factory, ours):
    """A 1.3 s clip at the VAE's input rate (not a whole number of patches)."""
    rate = ours[2].config.sample_rate
    t = np.arange(int(1.3 * rate)) / rate
    audio = (0.3 * np.sin(2 * np.pi * 220 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    path = tmp_path_factory.mktemp("clip") / "voice.wav"
    sf.write(str(path), audio, rate)
    # What upstream reads back (16-bit PCM), so both encode the very same samples.
    return path, torch.from_numpy(sf.read(str(path), dtype="float32")[0])


def upstream_inputs(captured):
    return captured["inputs"]


def _our_prompt(ours, mode, audio):
    checkpoint, _, vae, tokenizer = ours
    c = checkpoint.config
    text = PROMPT_TEXT + TEXT if mode in ("continuation", "both") else TEXT
    reference = encode_patches(vae, audio, c.patch_size, at_start=False) if mode in ("reference", "both") else None
    continuation = encode_patches(vae, audio, c.patch_size, at_start=True) if mode in ("continuation", "both") else None
    return build_prompt(tokenizer(text), c.patch_size, c.feat_dim, reference=reference, continuation=continuation)


def _upstream_kwargs(mode, path):
    kwargs = {"target_text": TEXT}
    if mode in ("continuation", "both"):
        kwargs.update(prompt_text=PROMPT_TEXT, prompt_wav_path=str(path))
    if mode in ("reference", "both"):
        kwargs["reference_wav_path"] = str(path)
    return kwargs


def test_tokenizer_splits_multichar_cjk_tokens_as_upstream(ours, ckpt):
    from transformers import LlamaTokenizerFast

    from tritontts.upstream import package_module

    with package_module("voxcpm", ("modules", "model"), "voxcpm.model.utils", {"librosa": {}}) as m:
        upstream = m.mask_multichar_chinese_tokens(LlamaTokenizerFast.from_pretrained(str(ckpt)))
    tokenizer = ours[3]
    assert tokenizer.multichar, "the tiny vocabulary has multi-character CJK tokens"
    for text in (TEXT, "你好世界，今天天气很好。", "Mixed 你好 text 123"):
        assert tokenizer(text) == upstream(text), text
    cjk = "你好世界，今天天气很好。"
    assert len(tokenizer(cjk)) > len(tokenizer.tokenizer.tokenize(cjk)), "some token was split"


@pytest.mark.parametrize("mode", ["zero_shot", "reference", "continuation", "both"])
def test_generated_patches_and_audio_match_upstream(ours, upstream, clip, mode, monkeypatch):
    path, audio = clip
    checkpoint, talker, vae, tokenizer = ours
    prompt = _our_prompt(ours, mode, audio)
    c = checkpoint.config
    steps = max_steps(len(tokenizer(TEXT)), 2000)

    # Upstream: capture the latents its _inference returns (generate decodes them).
    captured = {}
    original = upstream._inference

    def spy(*args, **kwargs):
        captured["inputs"] = args[:4]
        for item in original(*args, **kwargs):
            captured["latents"], captured["context"] = item[0], item[2]
            yield item

    monkeypatch.setattr(upstream, "_inference", spy)
    torch.manual_seed(11)
    ref_audio = upstream.generate(**_upstream_kwargs(mode, path))[0]

    # The prompt: ids and masks exactly upstream's; the reference's latents through our VAE
    # encoder within float rounding (weight norm folded here, applied per call upstream).
    text, text_mask, feat, feat_mask = (a[0] for a in upstream_inputs(captured))
    assert torch.equal(text.long(), prompt.ids) and torch.equal(text_mask.float(), prompt.text_mask)
    assert torch.equal(feat_mask.float(), prompt.audio_mask)
    feat_diff = (feat - prompt.feats).abs().max().item()
    assert feat_diff < 1e-4
    # The talker from the very same prompt latents, so its own differences show alone.
    prompt = replace(prompt, feats=feat.float(), context=feat[len(feat) - prompt.context.shape[0]:].float())

    torch.manual_seed(11)
    patches = talker.generate(prompt, lambda: torch.randn(1, c.feat_dim, c.patch_size), max_len=steps)
    latents = torch.cat([prompt.context, patches]).reshape(-1, c.feat_dim).T     # [D, frames]
    assert captured["context"] == prompt.context.shape[0]
    diff = (latents - captured["latents"][0]).abs().max().item()
    print(f"{mode}: {patches.shape[0]} patches, prompt latents max-abs-diff {feat_diff:.2e}, "
          f"generated latents max-abs-diff {diff:.2e} (peak {latents.abs().max():.2f})")
    assert latents.shape == captured["latents"][0].shape
    assert diff < 1e-4

    # The VAE stage by itself: upstream's latents through our decoder give upstream's audio.
    cut = prompt.context.shape[0] * c.patch_size * vae.config.decode_hop
    vae_diff = (vae.decode(captured["latents"].float())[0, cut:] - ref_audio).abs().max().item()
    # End to end: our latents' audio; the VAE amplifies the latents' rounding about tenfold.
    audio_out = vae.decode(latents[None])[0, cut:]
    audio_diff = (audio_out - ref_audio).abs().max().item()
    print(f"{mode}: audio of upstream's latents max-abs-diff {vae_diff:.2e}; of ours {audio_diff:.2e} "
          f"over {audio_out.numel()} samples")
    assert vae_diff < 1e-4
    assert audio_out.shape == ref_audio.shape and audio_diff < 5e-4

    # Negative control: another cfg value changes the patches.
    torch.manual_seed(11)
    other = talker.generate(prompt, lambda: torch.randn(1, c.feat_dim, c.patch_size), cfg=1.5, max_len=3)
    assert (other - patches[:3]).abs().max() > 1e-3


def test_prompt_layout_of_each_mode(ours, clip):
    _, audio = clip
    zero = _our_prompt(ours, "zero_shot", audio)
    assert zero.ids[-1] == 101 and zero.audio_mask.sum() == 0 and zero.context.shape[0] == 0
    ref = _our_prompt(ours, "reference", audio)
    assert ref.ids[0] == 103 and 104 in ref.ids.tolist() and ref.ids[-1] == 101
    cont = _our_prompt(ours, "continuation", audio)
    assert cont.audio_mask[-1] == 1 and cont.context.shape[0] == 3
    assert torch.equal(cont.context, cont.feats[-3:])
    both = _our_prompt(ours, "both", audio)
    assert both.ids[0] == 103 and both.audio_mask[-1] == 1
