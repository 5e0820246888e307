"""Write a random-weight GLM-TTS checkpoint in the released layout (tritontts.families.glm_tts.checkpoint).

Same folders, files, key names, config fields and special tokens as zai-org/GLM-TTS. `tiny`
runs in seconds on a CPU (the tests); `released` has the released network sizes (a 28-layer,
2048-wide Llama; the 18-layer, 768-wide DiT with its 100000-row token table; the 512-channel
HiFT; a whisper-large-v3-width WhisperVQ) for measuring speed. Sizes not published as a
config (the Llama's heads and feed-forward width, the text vocabulary of 59246 rows before
the special tokens) are inferred: <|user|> = 59253, upstream's stop id, fixes the latter.

    python -m tritontts.families.glm_tts.random_checkpoint OUT [--size released] [--seed N]
"""
from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import torch

from ...weights.random_weights import random_checkpoint_cli
from .checkpoint import TOKENIZER_DIR
from .tokenizer import AUDIO_TOKENS, GLM4_PATTERN

# ChatGLM4's special tokens, in its order after the BPE ranks: <|user|> is the 8th, which
# with the released 59246 BPE ranks gives upstream's stop id 59253.
GLM4_SPECIALS = ("<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>",
                 "<|user|>", "<|assistant|>", "<|observation|>", "<|begin_of_image|>",
                 "<|end_of_image|>", "<|begin_of_video|>", "<|end_of_video|>",
                 "<|begin_of_audio|>", "<|end_of_audio|>")
RELEASED_TEXT_RANKS = 59246
# head_dim 64 everywhere: vLLM's CPU attention rejects smaller heads.
SIZES = {
    "tiny": dict(llama=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=1),
                 stop_bias=0.1, text_ranks=320, dit=dict(dim=128, depth=2, heads=2, token_dim=32, conv_layers=2,
                                          vocab=AUDIO_TOKENS)),
    "released": dict(llama=dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                                num_attention_heads=16, num_key_value_heads=4),
                     stop_bias=3.0, text_ranks=RELEASED_TEXT_RANKS,
                     dit=dict(dim=768, depth=18, heads=12, token_dim=512, conv_layers=4, vocab=100000)),
}
# flow/config.yaml as upstream writes it (hyperpyyaml; the tag names its Flow class).
FLOW_YAML = """\
flow: !new:flow.flow.Flow
    speech_token_dim: {token_dim}
    vocab_size: {vocab}
    input_frame_rate: 25
    spk_embed_dim: 80
    mel_dim: 80
    big_model: false
    spkr_emb_adaLN: true
    calc_prompt_mel_loss: true
    speech_token_cfg: false
    use_wavlm_emb: false
    remove_spkr_concat_condition: true
    t_scheduler: cosine
    loss_type: l2
    use_mdt: false
    mel_framerate: 50
"""
# A little English to learn the tiny tokenizer's merges from (so words are a few tokens
# each, as with the real one, and tests' utterances stay short).
CORPUS = ("The quick brown fox jumps over the lazy dog. This is the reference voice. "
          "Hello world, this is a test of the speech system. One two three four five six "
          "seven eight nine ten. Streaming speech from text, sentence by sentence. ") * 8


def write_tokenizer(folder: Path, size: str) -> dict[str, int]:
    """tokenizer.model (tiktoken ranks) and tokenizer_config.json; returns the added ids."""
    folder.mkdir(parents=True, exist_ok=True)
    n_ranks = SIZES[size]["text_ranks"]
    if size == "tiny":
        from tiktoken._educational import bpe_train

        ranks = bpe_train(CORPUS, n_ranks, GLM4_PATTERN, visualise=None)
    else:
        # Released width: the 256 bytes plus filler multi-byte tokens, only so the ids of
        # the special tokens sit where the released ones do.
        ranks = {bytes([b]): b for b in range(256)}
        for n in range(256, n_ranks):
            ranks[b"\xff\xfe" + n.to_bytes(3, "big")] = n
    (folder / "tokenizer.model").write_text(
        "".join(f"{base64.b64encode(token).decode()} {rank}\n" for token, rank in ranks.items()))
    added = [*GLM4_SPECIALS, *(f"<|audio_{n}|>" for n in range(AUDIO_TOKENS))]
    ids = {token: len(ranks) + i for i, token in enumerate(added)}
    config = {
        "added_tokens_decoder": {str(i): {"content": t, "lstrip": False, "normalized": False,
                                          "rstrip": False, "single_word": False, "special": True}
                                 for t, i in ids.items()},
        "auto_map": {"AutoTokenizer": ["tokenization_chatglm.ChatGLM4Tokenizer", None]},
        "clean_up_tokenization_spaces": False, "do_lower_case": False, "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>", "model_max_length": 1000000000000000019884624838656,
        "padding_side": "left", "remove_space": False, "tokenizer_class": "ChatGLM4Tokenizer",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return ids


def write_llm(folder: Path, size: str, vocab: int, ids: dict[str, int], seed: int) -> None:
    """llm/: a Hugging Face Llama (config.json + model.safetensors). The released size is
    written in bfloat16, as released talkers are (fp32 would not fit beside a server here)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    dtype = torch.float32 if size == "tiny" else torch.bfloat16
    config = LlamaConfig(vocab_size=vocab, max_position_embeddings=4096, rope_theta=10000.0,
                         rms_norm_eps=1e-5, tie_word_embeddings=False, hidden_act="silu",
                         bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|user|>"],
                         pad_token_id=ids["<|endoftext|>"], torch_dtype=str(dtype).split(".")[1],
                         **SIZES[size]["llama"])
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(dtype)
    # A random talker would hardly ever sample <|user|> and always run to 20 tokens per text
    # token (seconds of audio per word: slow tests, and benchmarks timing speech no real
    # model makes). A direction shared by every audio token's embedding, read by the
    # <|user|> row of lm_head, makes a stream end some 20-30 tokens past its minimum length
    # (measured under RAS: 4-5% a step; `stop_bias` per size, found by measuring).
    ats = ids["<|audio_0|>"]
    shared = torch.randn(config.hidden_size, generator=torch.Generator().manual_seed(seed))
    shared /= shared.norm()
    with torch.no_grad():
        model.model.embed_tokens.weight[ats:ats + AUDIO_TOKENS] += shared.to(dtype)
        model.lm_head.weight[ids["<|user|>"]] = (SIZES[size]["stop_bias"] * shared).to(dtype)
    model.save_pretrained(str(folder), safe_serialization=True)


def write_flow(folder: Path, size: str, seed: int) -> None:
    from .flow import GLMTTSDiT, GLMTTSFlow

    folder.mkdir(parents=True, exist_ok=True)
    dit = dict(SIZES[size]["dit"])
    (folder / "config.yaml").write_text(FLOW_YAML.format(token_dim=dit["token_dim"], vocab=dit["vocab"]))
    torch.manual_seed(seed + 1)
    flow = GLMTTSFlow(GLMTTSDiT(**dit, ff_mult=2, mel_dim=80, cond_dim=80, speaker_adaln=True))
    with torch.no_grad():
        # Upstream's init leaves AdaLN-Zero gates at zero, which would make a random DiT
        # ignore its blocks; small random values keep every path live for parity tests.
        for name, p in flow.named_parameters():
            if name.endswith("weight") and p.ndim >= 2:
                p.normal_(std=0.02 if size != "tiny" else 0.1)
    torch.save(flow.state_dict(), folder / "flow.pt")


def write_random_checkpoint(out: str | Path, seed: int = 0, size: str = "tiny") -> Path:
    from ...nn.speaker import write_random_campplus
    from .speech_tokenizer import write_random_speech_tokenizer
    from .vocoder import write_random_hift

    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ids = write_tokenizer(out / TOKENIZER_DIR, size)
    write_llm(out / "llm", size, max(ids.values()) + 1, ids, seed)
    write_flow(out / "flow", size, seed)
    (out / "hift").mkdir(exist_ok=True)
    write_random_hift(out / "hift" / "hift.pt", seed=seed + 2, size=size)
    write_random_speech_tokenizer(out / "speech_tokenizer", seed=seed + 3, size=size)
    (out / "frontend").mkdir(exist_ok=True)
    write_random_campplus(out / "frontend" / "campplus.onnx", np.random.default_rng(seed))
    return out


def main(argv=None):
    random_checkpoint_cli(__doc__, SIZES, write_random_checkpoint, argv)


if __name__ == "__main__":
    main()
