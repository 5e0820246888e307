"""The released CosyVoice3 checkpoint layout, opened from a path (nothing is downloaded).

  <root>/cosyvoice3.yaml            hyper-parameters (hyperpyyaml, read as data)
  <root>/llm.pt                     talker state dict (Qwen2 + speech_embedding + llm_decoder)
  <root>/flow.pt                    flow-matching state dict
  <root>/hift.pt                    CausalHiFT vocoder state dict
  <root>/campplus.onnx              CAM++ speaker embedding (192-d)
  <root>/speech_tokenizer_v3.onnx   speech tokenizer (16 kHz whisper mel -> 25 Hz tokens)
  <root>/CosyVoice-BlankEN/         Qwen2 config.json + tokenizer files
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...weights.checkpoint import CheckpointError, require_dir, require_files
from ...weights.hyperpyyaml import load_hyperpyyaml

TEXT_MODEL_DIR = "CosyVoice-BlankEN"
REQUIRED_FILES = ("cosyvoice3.yaml", "llm.pt", "flow.pt", "hift.pt", "campplus.onnx",
                  "speech_tokenizer_v3.onnx", f"{TEXT_MODEL_DIR}/config.json",
                  f"{TEXT_MODEL_DIR}/tokenizer_config.json")


@dataclass(frozen=True)
class CosyVoice3Checkpoint:
    root: Path
    config: dict

    def path(self, name: str) -> Path:
        return self.root / name

    @property
    def text_model_dir(self) -> Path:
        return self.root / TEXT_MODEL_DIR

    def state_dict(self, name: str) -> dict:
        """Load llm.pt / flow.pt / hift.pt (tensors only: no pickled code runs)."""
        import torch

        path = self.path(name)
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any failure is a bad file
            raise CheckpointError(f"{path}: not a readable state dict ({exc})") from None
        if not isinstance(state, dict) or not state:
            raise CheckpointError(f"{path}: expected a non-empty state dict")
        return state


def open_checkpoint(root: str | Path) -> CosyVoice3Checkpoint:
    root = require_dir(root, "CosyVoice3")
    require_files(root, REQUIRED_FILES, "CosyVoice3")
    tokenizer_dir = root / TEXT_MODEL_DIR
    if not (tokenizer_dir / "tokenizer.json").is_file() and not (
            (tokenizer_dir / "vocab.json").is_file() and (tokenizer_dir / "merges.txt").is_file()):
        raise CheckpointError(f"{tokenizer_dir}: needs tokenizer.json or vocab.json + merges.txt")
    try:
        config = load_hyperpyyaml(root / "cosyvoice3.yaml",
                                  {"qwen_pretrain_path": str(tokenizer_dir)})
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None
    for block in ("llm", "flow", "hift"):
        if not isinstance(config.get(block), dict):
            raise CheckpointError(f"{root / 'cosyvoice3.yaml'}: no `{block}:` block")
    return CosyVoice3Checkpoint(root, config)
