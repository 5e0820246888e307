"""A Qwen3-ForcedAligner checkpoint with random weights in the released layout
(Qwen/Qwen3-ForcedAligner-0.6B: config.json with its thinker_config, model.safetensors under
`thinker.`, Qwen2's BPE tokenizer files with the audio and <timestamp> tokens,
preprocessor_config.json), at "tiny" (CI) or "released" size (the 0.6B's shapes; its
vocabulary is the tiny tokenizer's, so the embedding is smaller than the release's).

    python -m tritontts.alignment.random_checkpoint OUT [--size tiny|released] [--seed N]
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..weights.random_weights import randomize, random_checkpoint_cli, save_safetensors, write_qwen2_tokenizer

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_end|>",
                  "<|audio_pad|>", "<timestamp>")
# Text the tiny tokenizer is trained on: words of the aligner's languages, so that test
# sentences tokenize into a few pieces each.
CORPUS = ("The quick brown fox jumps over the lazy dog. Hello there, how are you today? "
          "Bonjour, comment allez-vous? Guten Tag, wie geht es Ihnen? Buenos días, ¿cómo está? "
          "Buongiorno, come sta? Olá, tudo bem? Привет, как дела? 你好，今天天气很好。"
          "こんにちは、お元気ですか。안녕하세요, 잘 지내요? 0123456789 ' ")
SIZES = {
    "tiny": dict(audio=dict(num_mel_bins=128, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64,
                            d_model=32, n_window=50, n_window_infer=800, downsample_hidden_size=8),
                 text=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=16, mrope_section=[4, 2, 2])),
    "released": dict(audio=dict(num_mel_bins=128, encoder_layers=24, encoder_attention_heads=16,
                                encoder_ffn_dim=4096, d_model=1024, n_window=50, n_window_infer=800,
                                downsample_hidden_size=480),
                     text=dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                               num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                               mrope_section=[24, 20, 20])),
}
CLASSES = 5000              # timestamp classes: 5000 x 80 ms = 400 s
SEGMENT_MS = 80


def write_random_checkpoint(out: str | Path, seed: int = 0, size: str = "tiny") -> Path:
    from .qwen3_forced_aligner import AlignerConfig, ForcedAlignerNetwork

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ids = write_qwen2_tokenizer(out, SPECIAL_TOKENS, CORPUS, vocab_size=600, eos_token="<|im_end|>")
    vocab = max(ids.values()) + 1
    shape = SIZES[size]
    text = dict(shape["text"])
    sections = text.pop("mrope_section")
    config = {
        "architectures": ["Qwen3ASRForConditionalGeneration"],
        "model_type": "qwen3_asr",
        "thinker_config": {
            "model_type": "qwen3_forced_aligner",
            "audio_config": {**shape["audio"], "output_dim": text["hidden_size"], "activation_function": "gelu",
                             "max_source_positions": 1500, "conv_chunksize": 500, "dropout": 0.0,
                             "attention_dropout": 0.0, "activation_dropout": 0.0, "scale_embedding": False,
                             "model_type": "qwen3_asr_audio_encoder"},
            "text_config": {**text, "vocab_size": vocab, "hidden_act": "silu", "rms_norm_eps": 1e-6,
                            "rope_theta": 1000000.0, "attention_bias": False, "max_position_embeddings": 65536,
                            "rope_scaling": {"mrope_section": sections, "interleaved": True, "rope_type": "default"},
                            "tie_word_embeddings": False, "model_type": "qwen3_asr_text"},
            "classify_num": CLASSES,
            "audio_token_id": ids["<|audio_pad|>"],
            "audio_start_token_id": ids["<|audio_start|>"],
        },
        "timestamp_token_id": ids["<timestamp>"],
        "timestamp_segment_time": SEGMENT_MS,
        "support_languages": ["Chinese", "English", "Cantonese", "French", "German", "Italian", "Japanese",
                              "Korean", "Portuguese", "Russian", "Spanish"],
        "torch_dtype": "bfloat16",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "preprocessor_config.json").write_text(json.dumps({
        "feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 128, "sampling_rate": 16000,
        "hop_length": 160, "n_fft": 400, "chunk_length": 30, "padding_side": "right", "padding_value": 0.0,
        "return_attention_mask": True, "processor_class": "Qwen3ASRProcessor"}, indent=2))
    network = ForcedAlignerNetwork(AlignerConfig.read(out))
    state = randomize(network, torch.Generator().manual_seed(seed))
    save_safetensors({f"thinker.{k}": v for k, v in state.items()}, out / "model.safetensors",
                     torch.float32 if size == "tiny" else torch.bfloat16)
    return out


if __name__ == "__main__":
    random_checkpoint_cli(__doc__, SIZES, write_random_checkpoint)
