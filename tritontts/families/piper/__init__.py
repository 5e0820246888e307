"""Piper (VITS) family: text stage (normalize, split, phonemize) -> VITS stage (ONNX)."""
