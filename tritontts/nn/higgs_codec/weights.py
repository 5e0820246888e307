"""The transformers layout (config.json + model.safetensors) read into our decoder."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import Tensor

from ...weights.checkpoint import (
    CheckpointError,
    load_strict,
    require_dir,
    require_files,
)
from .config import (
    _WHAT,
    CONFIG_FILE,
    LEGACY_WEIGHTS_FILE,
    MODEL_TYPE,
    WEIGHTS_FILE,
    HiggsCodecConfig,
)
from .decoder import HiggsCodecDecoder
from .legacy import (
    _LEGACY_DECODER_KEY,
    _from_legacy,
    _legacy_config,
    _read_legacy_weights,
)
from .weight_norm import _fold_norm_pairs


def _read_json(path: Path) -> dict:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    return raw


def _config_from(raw: Mapping[str, Any], path: Path) -> HiggsCodecConfig:
    try:
        return HiggsCodecConfig.from_dict(raw)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise CheckpointError(f"{path}: {type(exc).__name__}: {exc}") from None


def _codec_files(root: Path) -> tuple[dict, Path]:
    """config.json's mapping and the weights file the codec is in: model.safetensors (the
    transformers layout) or model.pth (boson-ai's standalone layout, below). With both
    present config.json decides: model_type higgs_audio_v2_tokenizer is the transformers
    layout, anything else boson's, whose model.safetensors is not the codec (vLLM-Omni's
    loader notes it is another artefact of that repo)."""
    require_files(root, (CONFIG_FILE,), _WHAT)
    raw = _read_json(root / CONFIG_FILE)
    transformers_layout = raw.get("model_type") == MODEL_TYPE
    if not transformers_layout and (root / LEGACY_WEIGHTS_FILE).is_file():
        return raw, root / LEGACY_WEIGHTS_FILE
    if not (root / WEIGHTS_FILE).is_file():
        why = (f"config.json's model_type {MODEL_TYPE} is the transformers layout, which has no "
               f"{LEGACY_WEIGHTS_FILE}" if transformers_layout and (root / LEGACY_WEIGHTS_FILE).is_file()
               else f"nor is boson-ai's {LEGACY_WEIGHTS_FILE} there")
        raise CheckpointError(f"{root / WEIGHTS_FILE}: missing from the {_WHAT} checkpoint ({why})")
    return raw, root / WEIGHTS_FILE


_DECODER_KEY = re.compile(r"(acoustic_decoder|fc2)\.|quantizer\.quantizers\.\d+\.(codebook\.embed$|project_out\.)")
# Weight norm as torch.nn.utils.parametrizations stores it, and as the older hook does.
def _read_decoder_weights(path: Path) -> dict[str, Tensor]:
    """The decode path's tensors in float32, weight norm folded; nothing else is read."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            tensors = {k: f.get_tensor(k).float() for k in f.keys() if _DECODER_KEY.match(k)}
    except (OSError, SafetensorError) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None
    if not tensors:
        raise CheckpointError(f"{path}: no decoder tensors (quantizer.*, fc2.*, acoustic_decoder.*)")
    return _fold_norm_pairs(tensors)


def load_codec_decoder(codec_dir: str | Path, device: str | torch.device = "cpu") -> HiggsCodecDecoder:
    """The decoder from an audio_tokenizer/ folder, transformers' layout or boson-ai's
    (see _codec_files), fp32, eval mode, on `device`. A missing or malformed file, and any
    missing, extra or wrongly shaped decoder tensor, raise CheckpointError naming the file."""
    root = require_dir(codec_dir, _WHAT)
    raw, weights_path = _codec_files(root)
    if weights_path.name == LEGACY_WEIGHTS_FILE:
        tensors = _read_legacy_weights(weights_path)
        cfg = _config_from(_legacy_config(raw, root / CONFIG_FILE, tensors), root / CONFIG_FILE)
        module = HiggsCodecDecoder(cfg)
        weights = _from_legacy(tensors, module.state_dict(), cfg, weights_path,
                               _LEGACY_DECODER_KEY.match)
    else:
        cfg = _config_from(raw, root / CONFIG_FILE)
        module = HiggsCodecDecoder(cfg)
        weights = _read_decoder_weights(weights_path)
    load_strict(module, weights, f"{weights_path} (decoder tensors)")
    return module.to(device=device, dtype=torch.float32).eval()
