"""The released GLM-TTS checkpoint layout (zai-org/GLM-TTS), opened from a path; nothing is
downloaded and nothing in it is executed.

  <root>/llm/                        the talker: a Hugging Face Llama (config.json + safetensors)
  <root>/vq32k-phoneme-tokenizer/    text tokenizer: tokenizer.model + tokenizer_config.json
  <root>/flow/flow.pt                flow-matching DiT state dict; beside it config.yaml
                                     (hyperpyyaml, read as data) or config.json
  <root>/hift/hift.pt                24 kHz HiFT vocoder (weights only; its sizes are fixed
                                     upstream), or
  <root>/vocos2d/generator_jit.ckpt  32 kHz Vocos2D vocoder, TorchScript only
  <root>/speech_tokenizer/           WhisperVQ speech tokenizer (config.json, model.safetensors,
                                     preprocessor_config.json): reference audio -> tokens
  <root>/frontend/campplus.onnx      CAM++ speaker embedding (192-d)

There is no root config.json (upstream finds each part by its folder name).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...weights.checkpoint import CheckpointError, require_dir, require_files

TOKENIZER_DIR = "vq32k-phoneme-tokenizer"
HIFT = "hift/hift.pt"
VOCOS2D = "vocos2d/generator_jit.ckpt"
REQUIRED_FILES = ("llm/config.json", f"{TOKENIZER_DIR}/tokenizer.model",
                  f"{TOKENIZER_DIR}/tokenizer_config.json", "flow/flow.pt",
                  "speech_tokenizer/config.json", "speech_tokenizer/model.safetensors",
                  "speech_tokenizer/preprocessor_config.json", "frontend/campplus.onnx")
# Flow settings upstream's yaml fixes for the released model, used where a config omits them.
FLOW_DEFAULTS = {"input_frame_rate": 25, "mel_framerate": 50, "mel_dim": 80,
                 "spkr_emb_adaLN": True, "remove_spkr_concat_condition": True,
                 "speech_token_cfg": False, "t_scheduler": "cosine"}


@dataclass(frozen=True)
class GLMTTSCheckpoint:
    root: Path
    flow_config: dict[str, Any]
    vocoder: str          # "hift" (24 kHz) or "vocos2d" (32 kHz)

    def path(self, name: str) -> Path:
        return self.root / name

    @property
    def llm_dir(self) -> Path:
        return self.root / "llm"

    @property
    def llm_dtype(self) -> str:
        """The talker weights' dtype as llm/config.json states it (float32 if it does not)."""
        config = json.loads((self.llm_dir / "config.json").read_text(encoding="utf-8"))
        dtype = config.get("torch_dtype") or config.get("dtype") or "float32"
        return str(dtype).removeprefix("torch.")

    @property
    def tokenizer_dir(self) -> Path:
        return self.root / TOKENIZER_DIR

    @property
    def sample_rate(self) -> int:
        return 24000 if self.vocoder == "hift" else 32000

    def flow_state(self) -> dict:
        """flow.pt's tensors (weights_only: no pickled code runs)."""
        import torch

        from .flow import flow_state_dict

        path = self.path("flow/flow.pt")
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any failure is a bad file
            raise CheckpointError(f"{path}: not a readable state dict ({exc})") from None
        return flow_state_dict(obj, path)


def _flow_config(folder: Path) -> dict[str, Any]:
    """The `flow` block of flow/config.yaml (or config.json), tags recorded, not executed."""
    from ...weights.hyperpyyaml import kwargs_of, load_hyperpyyaml

    yaml_path, json_path = folder / "config.yaml", folder / "config.json"
    if yaml_path.is_file():
        try:
            raw = load_hyperpyyaml(yaml_path)
        except ValueError as exc:
            raise CheckpointError(str(exc)) from None
        path = yaml_path
    elif json_path.is_file():
        try:
            raw = json.loads(json_path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise CheckpointError(f"{json_path}: not JSON ({exc})") from None
        path = json_path
    else:
        raise CheckpointError(f"{folder}: needs config.yaml or config.json beside flow.pt")
    block = raw.get("flow", raw) if isinstance(raw, dict) else None
    if not isinstance(block, dict):
        raise CheckpointError(f"{path}: expected a mapping with a `flow` block")
    config = {**FLOW_DEFAULTS, **kwargs_of(block)}
    for key in ("input_frame_rate", "mel_framerate"):
        if not isinstance(config[key], (int, float)) or config[key] <= 0:
            raise CheckpointError(f"{path}: flow.{key} must be a positive number")
    if config["mel_framerate"] != 2 * config["input_frame_rate"]:
        raise CheckpointError(f"{path}: flow.mel_framerate must be twice input_frame_rate "
                              "(2 mel frames per speech token), got "
                              f"{config['mel_framerate']} and {config['input_frame_rate']}")
    return config


def open_checkpoint(root: str | Path) -> GLMTTSCheckpoint:
    root = require_dir(root, "GLM-TTS")
    require_files(root, REQUIRED_FILES, "GLM-TTS")
    if not any((root / "llm").glob("*.safetensors")):
        raise CheckpointError(f"{root / 'llm'}: no *.safetensors weights")
    if (root / HIFT).is_file():
        vocoder = "hift"
    elif (root / VOCOS2D).is_file():
        vocoder = "vocos2d"
    else:
        raise CheckpointError(f"{root}: needs a vocoder, {HIFT} (24 kHz) or {VOCOS2D} (32 kHz)")
    return GLMTTSCheckpoint(root, _flow_config(root / "flow"), vocoder)
