"""Qwen3-TTS family (12 Hz speech tokenizer; 16 codebooks x 2048 codes -> 24 kHz audio)."""
