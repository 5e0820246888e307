"""Random-weight Voxtral TTS checkpoints in the released (Mistral) layout
(tritontts.families.voxtral_tts.checkpoint): params.json, consolidated.safetensors (backbone under
Mistral names, the audio embeddings, acoustic_transformer.*, audio_tokenizer.*), tekken.json
and voice_embedding/NAME.pt. `tiny` runs in seconds (tests); `released` has the released
model's sizes (~4 B parameters, bfloat16 as released) for measuring speed: the Ministral-3B
backbone, a 3-layer acoustic transformer as wide as the backbone (the semantic head reads
the backbone's hidden state, so it must be), the codec at vLLM-Omni's AudioTokenizerArgs
defaults, a 131072-entry tekken.json. No released params.json is reachable here: the
backbone's and the acoustic transformer's widths are Ministral 3B's published shape, the
voice lengths a guess (marked INFERRED below).

  python -m tritontts.families.voxtral_tts.random_checkpoint OUT [--size released] [--seed N]

A tekken.json is tiktoken ranks (byte-level BPE, base64 token bytes) + special tokens by
name + an `audio` section; mistral-common reads it (MistralTokenizer.from_file) and lays out
speech requests from it, so the special tokens sit at the released ids (SPECIAL_TOKENS).
"""
from __future__ import annotations

import base64
import json
import math
from collections import Counter
from pathlib import Path

import torch

from ...weights.random_weights import random_checkpoint_cli, save_safetensors

# mistral-common's instruct tokenizer looks the control tokens up by name: the first 20 as
# every Tekken file has them, then the speech ones at the released ids (the others in
# between are named fillers here).
SPECIAL_TOKENS = dict(enumerate([
    "<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]",
    "[PREFIX]", "[MIDDLE]", "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]"]))
SPECIAL_TOKENS.update({20: "[ARGS]", 21: "[CALL_ID]", 24: "[AUDIO]", 25: "[BEGIN_AUDIO]",
                       26: "[TRANSCRIBE]", 35: "[REPEAT_AUDIO_TEXT]", 36: "[NEXT_AUDIO_TEXT]"})
# tiktoken's split before BPE: words with their leading space, numbers, punctuation runs.
PATTERN = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_CORPUS = ("Hello there, how are you today? The birch canoe slid on the smooth planks. "
           "Glue the sheet to the dark blue background. It's easy to tell the depth of a well. "
           "These days a chicken leg is a rare dish. One more sentence for speech synthesis: 0123456789!")


def byte_pair_ranks(corpus: str, merges: int) -> list[bytes]:
    """Token bytes in rank order: the 256 single bytes, then `merges` pairs learned greedily
    from `corpus` (most frequent adjacent pair first), each a concatenation of two earlier
    tokens, as tiktoken's merging needs."""
    import regex

    ranks = [bytes([b]) for b in range(256)]
    words = [[bytes([b]) for b in w.encode()] for w in regex.findall(PATTERN, corpus)]
    for _ in range(merges):
        pairs = Counter((a, b) for w in words for a, b in zip(w, w[1:]))
        if not pairs:
            break
        (a, b), _count = pairs.most_common(1)[0]
        ranks.append(a + b)
        for w in words:
            i = 0
            while i < len(w) - 1:
                if w[i] == a and w[i + 1] == b:
                    w[i:i + 2] = [a + b]
                i += 1
    return ranks


def write_tekken(path: str | Path, voices: dict[str, int], num_special: int = 100, merges: int = 200,
                 sampling_rate: int = 24000, frame_rate: float = 12.5, vocab_size: int | None = None) -> Path:
    """A tekken.json (version v13) with the speech special tokens at their released ids and
    an audio section whose voice_num_audio_tokens are `voices` (name -> placeholder count).
    `vocab_size` (specials included) pads the BPE ranks with byte strings no text reaches."""
    path = Path(path)
    ranks = byte_pair_ranks(_CORPUS * 4, merges)
    if vocab_size is not None:
        # Fillers: 0xff never occurs in UTF-8, so no text's merges can reach them.
        ranks += [b"\xff\xff" + k.to_bytes(3, "big") for k in range(vocab_size - num_special - len(ranks))]
    vocab = []
    for rank, token in enumerate(ranks):
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        vocab.append({"rank": rank, "token_bytes": base64.b64encode(token).decode(), "token_str": text})
    specials = [{"rank": i, "token_str": SPECIAL_TOKENS.get(i, f"<SPECIAL_{i}>"), "is_control": True}
                for i in range(num_special)]
    data = {
        "config": {"pattern": PATTERN, "num_vocab_tokens": len(vocab),
                   "default_vocab_size": num_special + len(vocab),
                   "default_num_special_tokens": num_special, "version": "v13"},
        "vocab": vocab,
        "special_tokens": specials,
        "audio": {"sampling_rate": sampling_rate, "frame_rate": frame_rate,
                  # The spectrogram settings only serve a reference clip's encoder (not
                  # in the released checkpoint); mistral-common requires valid ones.
                  "audio_encoding_config": {"num_mel_bins": 128, "hop_length": 160, "window_size": 400},
                  "voice_num_audio_tokens": dict(voices)},
    }
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def params_shape(backbone: dict, acoustic: dict, codec: dict, semantic_codebook_size: int,
                 voices: tuple[str, ...]) -> dict:
    """params.json's fields but vocab_size: the backbone's, the audio model's (37 codebooks:
    semantic, then 36 of 21 FSQ levels; 12.5 frames/s at 24 kHz) and the codec's."""
    return {
        **backbone, "norm_eps": 1e-5, "rope_theta": 1000000.0, "tied_embeddings": True,
        "audio_model_args": {
            "semantic_codebook_size": semantic_codebook_size, "acoustic_codebook_size": 21,
            "n_acoustic_codebook": 36, "audio_token_id": 24, "begin_audio_token_id": 25,
            "input_embedding_concat_type": "sum",
            "audio_encoding_args": {"sampling_rate": 24000, "frame_rate": 12.5, "num_codebooks": 37,
                                    "codebook_pattern": "parallel"},
            "acoustic_transformer_args": {"input_dim": backbone["dim"], "dim": backbone["dim"], "n_layers": 3,
                                          **acoustic, "use_biases": False, "norm_eps": 1e-5,
                                          "n_decoding_steps": 7, "sigma": 1e-5}},
        "audio_tokenizer_args": {
            **codec, "semantic_codebook_size": semantic_codebook_size, "acoustic_codebook_size": 21,
            "acoustic_dim": 36, "norm_eps": 0.01, "layer_scale_init": 0.01,
            "voice": {name: k for k, name in enumerate(voices)}},
    }


TINY = params_shape(
    # Head width 32: the smallest vLLM's CPU attention takes.
    {"dim": 64, "n_layers": 2, "n_heads": 2, "n_kv_heads": 1, "head_dim": 32, "hidden_dim": 128, "max_seq_len": 4096},
    {"head_dim": 16, "hidden_dim": 128, "n_heads": 4, "n_kv_heads": 2},
    {"dim": 64, "hidden_dim": 128, "head_dim": 16, "n_heads": 4, "n_kv_heads": 2, "semantic_dim": 16},
    64, ("casual_male", "neutral_female"))
VOICE_TOKENS = {"casual_male": 6, "neutral_female": 4}

# INFERRED: Ministral 3B's published shape; the acoustic transformer as wide as the backbone
# (required), its heads as the backbone's; the codec at vLLM-Omni's AudioTokenizerArgs
# defaults; the voices' lengths about 8 s of reference audio at 12.5 frames/s.
RELEASED = params_shape(
    {"dim": 3072, "n_layers": 26, "n_heads": 32, "n_kv_heads": 8, "head_dim": 128, "hidden_dim": 9216,
     "max_seq_len": 65536},
    {"head_dim": 128, "hidden_dim": 9216, "n_heads": 32, "n_kv_heads": 8},
    {"dim": 1024, "hidden_dim": 4096, "head_dim": 128, "n_heads": 8, "n_kv_heads": 8, "semantic_dim": 256},
    8192, ("casual_male", "neutral_female", "cheerful_female", "neutral_male"))
RELEASED_VOICE_TOKENS = {"casual_male": 100, "neutral_female": 96, "cheerful_female": 104, "neutral_male": 92}
SIZES = {"tiny": (TINY, VOICE_TOKENS, dict(num_special=100)),
         "released": (RELEASED, RELEASED_VOICE_TOKENS, dict(num_special=1000, vocab_size=131072))}


def _scaled(shape, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=generator) * shape[-1] ** -0.5


def random_codec_state(config, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """The codec's tensors (without the audio_tokenizer. prefix): weight-norm magnitudes,
    norm scales and layer scales near 1, a k-means codebook with positive usage counts."""
    from .codec import VoxtralCodec

    state = {}
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in VoxtralCodec(config).state_dict().items()}
    for name, shape in shapes.items():
        noise = torch.randn(shape, generator=generator)
        if name == "output_proj.conv.parametrizations.weight.original0":
            # The waveform's level: a few tenths, as speech is, rather than several units.
            state[name] = 0.05 * (1.0 + 0.1 * noise)
        elif name.endswith("original0") or name.endswith("norm.weight") or name.endswith("_scale"):
            state[name] = 1.0 + 0.1 * noise
        elif name.endswith("cluster_usage"):
            state[name] = 1.0 + 4 * torch.rand(shape, generator=generator)
        elif name.endswith("embedding_sum"):
            state[name] = noise
        else:
            state[name] = noise * shape[-1] ** -0.5
    return state


def random_state(params: dict, vocab_size: int, generator: torch.Generator,
                 dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Every tensor of consolidated.safetensors in `dtype`, each cast as it is made (the
    released size then never holds all ~4 B values in float32 at once)."""
    from .acoustic import AcousticTransformer
    from .checkpoint import params_json_config

    config = params_json_config(params)
    b, a = config.backbone, config.acoustic
    state: dict[str, torch.Tensor] = {}

    def put(name: str, value: torch.Tensor) -> None:
        state[name] = value.to(dtype)

    def norm(n: int) -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(n, generator=generator)

    for i in range(b.n_layers):
        layer = f"layers.{i}."
        for name, shape in (("attention.wq", (b.n_heads * b.head_dim, b.dim)),
                            ("attention.wk", (b.n_kv_heads * b.head_dim, b.dim)),
                            ("attention.wv", (b.n_kv_heads * b.head_dim, b.dim)),
                            ("attention.wo", (b.dim, b.n_heads * b.head_dim)),
                            ("feed_forward.w1", (b.hidden_dim, b.dim)), ("feed_forward.w2", (b.dim, b.hidden_dim)),
                            ("feed_forward.w3", (b.hidden_dim, b.dim))):
            put(layer + name + ".weight", _scaled(shape, generator))
        for name in ("attention_norm", "ffn_norm"):
            put(layer + name + ".weight", norm(b.dim))
    put("norm.weight", norm(b.dim))
    put("mm_audio_embeddings.tok_embeddings.weight", torch.randn(vocab_size, b.dim, generator=generator))
    put("mm_audio_embeddings.audio_codebook_embeddings.embeddings.weight",
        torch.randn(a.embedding_rows, b.dim, generator=generator) / math.sqrt(len(a.codebook_sizes)))
    if not b.tied_embeddings:
        put("output.weight", _scaled((vocab_size, b.dim), generator))
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in AcousticTransformer(a).state_dict().items()}
    for name, shape in shapes.items():
        put("acoustic_transformer." + name, norm(shape) if name.endswith("norm.weight") else _scaled(shape, generator))
    for name, value in random_codec_state(config.codec, generator).items():
        put("audio_tokenizer." + name, value)
    return state


def write_random_checkpoint(out: str | Path, seed: int = 0, size: str = "tiny") -> Path:
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    shape, voice_tokens, tekken_sizes = SIZES[size]
    out = Path(out)
    (out / "voice_embedding").mkdir(parents=True, exist_ok=True)
    tekken = write_tekken(out / "tekken.json", voice_tokens, **tekken_sizes)
    vocab_size = json.loads(tekken.read_text())["config"]["default_vocab_size"]
    params = {k: v for k, v in shape.items() if not k.startswith("audio_")}
    params.update(vocab_size=vocab_size, model_type="voxtral_tts",
                  multimodal={"audio_model_args": shape["audio_model_args"],
                              "audio_tokenizer_args": shape["audio_tokenizer_args"]})
    (out / "params.json").write_text(json.dumps(params, indent=2), encoding="utf-8")
    # The released weights are bfloat16; tiny ones stay float32 so parity tests are exact.
    dtype = torch.float32 if size == "tiny" else torch.bfloat16
    generator = torch.Generator().manual_seed(seed)
    save_safetensors(random_state(params, vocab_size, generator, dtype), out / "consolidated.safetensors", dtype)
    for voice, tokens in voice_tokens.items():
        rows = torch.randn(tokens, shape["dim"], generator=generator) * 0.5
        torch.save(rows.to(dtype), out / "voice_embedding" / f"{voice}.pt")
    return out


def main(argv=None):
    random_checkpoint_cli(__doc__, SIZES, write_random_checkpoint, argv)


if __name__ == "__main__":
    main()
