"""Write a random-weight Qwen3-TTS 12 Hz checkpoint in the released file layout.

Same files, same config fields, same tensor names as Qwen3-TTS-12Hz-*-{CustomVoice,
VoiceDesign,Base} (see checkpoint.py). The codec ids are the released ones (vocabulary 3072,
codebooks of 2048, speakers and languages where the released configs put them); the text
tokenizer is a small byte-level BPE trained here with the Qwen2 pre-tokenizer, whose special
tokens (<|im_start|>, <tts_pad>, ...) follow its vocabulary in the released order, and
config.json names those ids. `tiny` runs in seconds on a CPU (tests; head_dim stays 64 since
vLLM's CPU attention rejects smaller heads, and the code predictor is narrower than the
talker so small_to_mtp_projection is exercised, as in 1.7B); `0.6b` has the released 0.6B
sizes (for measuring speed).

Tensors come from this package's own modules built from the written config: the talker
(talker.py), the speaker encoder (speaker_encoder.py, Base only), the speech tokenizer's
encoder (speech_encoder.py) and decoder (code2wav.py).

`python -m tritontts.families.qwen3_tts.random_checkpoint OUT [--kind base] [--size 0.6b]` writes one.
"""
from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

import torch

from ...weights.random_weights import randomize, save_safetensors, write_qwen2_tokenizer
from .checkpoint import (CONFIG_FILE, GENERATION_FILE, KINDS, SPEAKER_ENCODER_PREFIX,
                         SPEECH_TOKENIZER_DIR, TALKER_PREFIX, TOKENIZER_TYPE,
                         WEIGHTS_FILE, parse_config)

# The released codec vocabulary: 2048 codes of codebook 0, then control tokens, languages
# and speakers (ids from the released config.json files).
CODEC_IDS = dict(codec_pad_id=2148, codec_bos_id=2149, codec_eos_token_id=2150, codec_think_id=2154,
                 codec_nothink_id=2155, codec_think_bos_id=2156, codec_think_eos_id=2157)
LANGUAGES = {"chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071,
             "spanish": 2054, "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069,
             "beijing_dialect": 2074, "sichuan_dialect": 2062}
SPEAKERS = {"serena": 3066, "vivian": 3065, "uncle_fu": 3010, "ryan": 3061, "aiden": 2861,
            "ono_anna": 2873, "sohee": 2864, "eric": 2875, "dylan": 2878}
DIALECTS = {"eric": "sichuan_dialect", "dylan": "beijing_dialect"}
# The released tokenizer's special tokens after Qwen2's vocabulary, in id order (151643,
# 151644, 151645, then 151669..151675); here they follow the small vocabulary in that order.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_end|>",
                  "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>", "<tts_text_bos_single>",
                  "<|audio_pad|>")
SPECIAL_IDS = {"im_start_token_id": "<|im_start|>", "im_end_token_id": "<|im_end|>",
               "tts_pad_token_id": "<tts_pad>", "tts_bos_token_id": "<tts_text_bos>",
               "tts_eos_token_id": "<tts_text_eod>"}
GENERATION_CONFIG = {"do_sample": True, "repetition_penalty": 1.05, "temperature": 0.9, "top_p": 1.0,
                     "top_k": 50, "subtalker_dosample": True, "subtalker_temperature": 0.9,
                     "subtalker_top_p": 1.0, "subtalker_top_k": 50, "max_new_tokens": 8192}

SIZES = {
    # Tiny is shaped like the 1.7B (a predictor narrower than the talker) and says so: a
    # CustomVoice tiny checkpoint follows instructions, as the 1.7B does.
    "tiny": dict(
        model_size="1b7",
        talker=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=1, head_dim=64, text_hidden_size=64,
                    mrope_section=[16, 8, 8]),
        predictor=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=1, num_key_value_heads=1, head_dim=64),
        text_vocab_size=None,   # the small tokenizer's size, rounded up
        speaker=dict(enc_channels=[32, 32, 32, 32, 96], enc_attention_channels=16, enc_se_channels=16),
        encoder=dict(hidden_size=64, num_filters=8, num_hidden_layers=1, intermediate_size=128,
                     num_attention_heads=1, num_key_value_heads=1, head_dim=64, codebook_dim=16,
                     vector_quantization_hidden_dimension=16, upsample_groups=64),
        decoder=dict(latent_dim=64, codebook_dim=32, hidden_size=64, intermediate_size=128,
                     head_dim=64, num_attention_heads=1, num_key_value_heads=1,
                     num_hidden_layers=1, decoder_dim=64, vector_quantization_hidden_dimension=32),
    ),
    # Qwen3-TTS-12Hz-0.6B as released (the 1.7B differs in talker width and MLP, 2048 / 6144).
    "0.6b": dict(
        model_size="0b6",
        talker=dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                    num_key_value_heads=8, head_dim=128, text_hidden_size=2048,
                    mrope_section=[24, 20, 20]),
        predictor=dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=5,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128),
        text_vocab_size=151936,
        speaker=dict(enc_channels=[512, 512, 512, 512, 1536], enc_attention_channels=128,
                     enc_se_channels=128),
        encoder=dict(hidden_size=512, num_filters=64, num_hidden_layers=8, intermediate_size=2048,
                     num_attention_heads=8, num_key_value_heads=8, head_dim=64, codebook_dim=256,
                     vector_quantization_hidden_dimension=256, upsample_groups=512),
        decoder=dict(latent_dim=1024, codebook_dim=512, hidden_size=512, intermediate_size=1024,
                     head_dim=64, num_attention_heads=16, num_key_value_heads=16,
                     num_hidden_layers=8, decoder_dim=1536, vector_quantization_hidden_dimension=512),
    ),
}
# Qwen3-TTS-12Hz-1.7B: the 0.6B with a talker of 2048 / 6144 (the predictor as narrow, so its
# input is projected down); "released" is the flagship (the released-size benchmark).
SIZES["1.7b"] = {**SIZES["0.6b"], "model_size": "1b7",
                 "talker": {**SIZES["0.6b"]["talker"], "hidden_size": 2048, "intermediate_size": 6144}}
SIZES["released"] = SIZES["1.7b"]
_CORPUS = ("<|im_start|>assistant\nThe quick brown fox jumps over the lazy dog.<|im_end|>\n"
           "<|im_start|>user\nSpeak slowly, in a warm and gentle voice.<|im_end|>\n"
           "Hello there, how are you today? I am fine, thank you, and you? 0123456789 "
           "Speech synthesis turns text into sound, one frame at a time. 你好，世界。")


def _write_tokenizer(out: Path) -> dict[str, int]:
    """The text tokenizer; "assistant", "user" and "\\n" come out as single tokens, as in
    the released vocabulary (the reference slices the chat template by token counts)."""
    return write_qwen2_tokenizer(out, SPECIAL_TOKENS, _CORPUS, single_tokens=("assistant", "user", "Ċ"),
                                 eos_token="<|im_end|>")


def _config(kind: str, size: str, special: dict[str, int]) -> dict:
    s = SIZES[size]
    talker = dict(s["talker"])
    mrope = talker.pop("mrope_section")
    text_vocab = s["text_vocab_size"] or (max(special.values()) // 64 + 1) * 64
    custom = kind == "custom_voice"
    return {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tokenizer_type": TOKENIZER_TYPE,
        "tts_model_type": kind,
        "tts_model_size": s["model_size"],
        **{name: special[token] for name, token in SPECIAL_IDS.items()},
        "assistant_token_id": special["assistant"],
        "speaker_encoder_config": {"enc_dim": talker["hidden_size"], "sample_rate": 24000,
                                   **s["speaker"]},
        "talker_config": {
            "model_type": "qwen3_tts_talker", **talker,
            "vocab_size": 3072, "text_vocab_size": text_vocab, "num_code_groups": 16,
            "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
            "rope_scaling": {"rope_type": "default", "mrope_section": mrope, "interleaved": True},
            "hidden_act": "silu", "attention_bias": False, "use_sliding_window": False,
            "position_id_per_seconds": 13, **CODEC_IDS,
            "codec_language_id": LANGUAGES,
            "spk_id": SPEAKERS if custom else {},
            "spk_is_dialect": {k: DIALECTS.get(k, False) for k in SPEAKERS} if custom else {},
            "code_predictor_config": {
                "model_type": "qwen3_tts_talker_code_predictor", **s["predictor"],
                "vocab_size": 2048, "num_code_groups": 16, "max_position_embeddings": 65536,
                "rms_norm_eps": 1e-6, "rope_theta": 1000000, "hidden_act": "silu",
                "attention_bias": False, "use_sliding_window": False,
                # transformers 5 no longer gives every config a pad_token_id, and the
                # reference's code predictor reads it.
                "pad_token_id": None,
            },
        },
    }


def speech_tokenizer_config(size: str) -> dict:
    s = SIZES[size]
    return {
        "architectures": ["Qwen3TTSTokenizerV2Model"], "model_type": "qwen3_tts_tokenizer_12hz",
        "encoder_valid_num_quantizers": 16, "input_sample_rate": 24000, "output_sample_rate": 24000,
        "decode_upsample_rate": 1920, "encode_downsample_rate": 1920,
        "encoder_config": {
            "_frame_rate": 12.5, "audio_channels": 1, "sampling_rate": 24000, "num_residual_layers": 1,
            "upsampling_ratios": [8, 6, 5, 4], "kernel_size": 7, "last_kernel_size": 3,
            "residual_kernel_size": 3, "dilation_growth_rate": 2, "use_causal_conv": True,
            "pad_mode": "constant", "compress": 2, "trim_right_ratio": 1.0, "codebook_size": 2048,
            "num_quantizers": 32, "num_semantic_quantizers": 1, "hidden_act": "gelu",
            "max_position_embeddings": 8000, "norm_eps": 1e-5, "rope_theta": 10000.0,
            "sliding_window": 250, "layer_scale_initial_scale": 0.01, "use_conv_shortcut": False,
            **s["encoder"]},
        "decoder_config": {
            "codebook_size": 2048, "semantic_codebook_size": 4096, "num_quantizers": 16,
            "num_semantic_quantizers": 1, "sliding_window": 72, "rope_theta": 10000,
            "rms_norm_eps": 1e-5, "layer_scale_initial_scale": 0.01, "hidden_act": "silu",
            "max_position_embeddings": 8000, "attention_bias": False,
            "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2], **s["decoder"]},
    }


PREPROCESSOR_CONFIG = {"chunk_length_s": None, "feature_extractor_type": "EncodecFeatureExtractor",
                       "feature_size": 1, "overlap": None, "padding_side": "right",
                       "padding_value": 0.0, "return_attention_mask": True, "sampling_rate": 24000}


def _module(name: str):
    """One of this package's model modules; a clear error while it does not exist yet."""
    try:
        return importlib.import_module(f"{__package__}.{name}")
    except ImportError as exc:
        raise RuntimeError(f"writing a random checkpoint needs {__package__}.{name} "
                           f"({exc}); it builds those tensors") from None


def _talker_state(config: dict, out: Path, generator: torch.Generator) -> dict[str, torch.Tensor]:
    from .talker import Qwen3TTSTalker

    talker = Qwen3TTSTalker(parse_config(config, out / CONFIG_FILE))
    return {TALKER_PREFIX + k: v for k, v in randomize(talker, generator).items()}


def _speaker_encoder_state(config: dict, out: Path) -> dict[str, torch.Tensor]:
    module = _module("speaker_encoder")
    encoder = module.SpeakerEncoder(module.SpeakerEncoderConfig.from_dict(
        config["speaker_encoder_config"], str(out / CONFIG_FILE)))
    # At the module's own (seeded) init, like the speech tokenizer below.
    return {SPEAKER_ENCODER_PREFIX + k: v.clone() for k, v in encoder.state_dict().items()}


def _speech_tokenizer_state(config: dict, generator: torch.Generator) -> dict[str, torch.Tensor]:
    encoder_module, decoder_module = _module("speech_encoder"), _module("code2wav")
    encoder = encoder_module.SpeechEncoder(encoder_module.SpeechEncoderConfig(
        config["encoder_config"], config["encoder_valid_num_quantizers"],
        config["input_sample_rate"], config["encode_downsample_rate"]))
    decoder = decoder_module.Qwen3TTSCode2Wav(decoder_module.Code2WavConfig.from_dict(
        config["decoder_config"], config["output_sample_rate"]))
    # SpeechEncoder's state dict already carries the file's encoder.* names.
    state = {k: v.clone() for k, v in encoder.state_dict().items()}
    state.update({decoder_module.STATE_DICT_PREFIX + k: v.clone() for k, v in decoder.state_dict().items()})
    return _live_codebooks(state, generator)


def _live_codebooks(state: dict[str, torch.Tensor], generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Codebooks start as zero sums at a module's init, which makes every code decode alike
    and every clip encode to one code: give them random entries (a codebook vector is
    embedding sum / cluster usage), usage 1, marked initialized."""
    for name, tensor in state.items():
        if name.endswith(("embedding_sum", "embed_sum")):
            state[name] = torch.randn(tensor.shape, generator=generator).to(tensor.dtype)
        elif name.endswith("cluster_usage"):
            state[name] = torch.ones_like(tensor)
        elif name.endswith("initialized"):
            state[name] = torch.ones_like(tensor)
    return state


def write_random_checkpoint(out: str | Path, kind: str = "custom_voice", seed: int = 0,
                            size: str = "tiny") -> Path:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    out = Path(out)
    (out / SPEECH_TOKENIZER_DIR).mkdir(parents=True, exist_ok=True)
    special = _write_tokenizer(out)
    special["assistant"] = json.loads((out / "vocab.json").read_text(encoding="utf-8"))["assistant"]
    config = _config(kind, size, special)
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
    (out / GENERATION_FILE).write_text(json.dumps(GENERATION_CONFIG, indent=2), encoding="utf-8")
    # The released weights are bfloat16; tiny ones stay float32 so parity tests are exact.
    dtype = torch.float32 if size == "tiny" else torch.bfloat16
    generator = torch.Generator().manual_seed(seed)
    state = _talker_state(config, out, generator)
    if kind == "base":
        torch.manual_seed(seed + 1)
        state.update(_speaker_encoder_state(config, out))
    save_safetensors(state, out / WEIGHTS_FILE, dtype)
    speech = speech_tokenizer_config(size)
    (out / SPEECH_TOKENIZER_DIR / CONFIG_FILE).write_text(json.dumps(speech, indent=2), encoding="utf-8")
    (out / SPEECH_TOKENIZER_DIR / "preprocessor_config.json").write_text(
        json.dumps(PREPROCESSOR_CONFIG, indent=2), encoding="utf-8")
    torch.manual_seed(seed + 2)
    save_safetensors(_speech_tokenizer_state(speech, generator), out / SPEECH_TOKENIZER_DIR / WEIGHTS_FILE, dtype)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--kind", choices=KINDS, default="custom_voice")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    args = parser.parse_args(argv)
    print(write_random_checkpoint(args.out, args.kind, args.seed, args.size))


if __name__ == "__main__":
    main()
