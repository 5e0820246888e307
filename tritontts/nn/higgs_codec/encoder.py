"""The encoder: transformers' HiggsAudioV2TokenizerModel (HuBERT + DAC encoder + RVQ
search) from the local folder only, and the torch resampler it needs."""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import math
import sys
import types
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...weights.checkpoint import (
    CheckpointError,
    ConfigFields,
    load_strict,
    require_dir,
)
from .config import _SEMANTIC_HIDDEN_DEFAULT, _WHAT, CONFIG_FILE, LEGACY_WEIGHTS_FILE
from .legacy import _BOSON_TEACHERS, _from_legacy, _legacy_config, _read_legacy_weights
from .weights import _codec_files, _config_from


def resample(waveform: Tensor, orig_freq: int, new_freq: int, lowpass_filter_width: int = 6,
             rolloff: float = 0.99, resampling_method: str = "sinc_interp_hann",
             beta: float | None = None) -> Tensor:
    """Band-limited sinc resampling along the last axis, the method and defaults of
    torchaudio.functional.resample (Hann-windowed sinc, 6 zero crossings, roll-off 0.99),
    which transformers' tokenizer calls and which cannot be installed beside this torch.

    Output j is sum_i x[i] h(i/orig - j/new), h a low-pass at rolloff * min(orig, new)/2
    (in rates reduced by their gcd). The filter for j + new is that of j shifted by orig
    inputs, so all `new` phases run as one strided conv with `new` output channels."""
    if resampling_method != "sinc_interp_hann" or beta is not None:
        raise ValueError(f"only sinc_interp_hann resampling is implemented, not {resampling_method!r}")
    if orig_freq == new_freq:
        return waveform
    gcd = math.gcd(int(orig_freq), int(new_freq))
    orig, new = int(orig_freq) // gcd, int(new_freq) // gcd
    cutoff = min(orig, new) * rolloff
    width = math.ceil(lowpass_filter_width * orig / cutoff)      # taps each side, in inputs
    dtype = waveform.dtype
    # Computed in the waveform's dtype, as torchaudio does, so the filters agree bit for bit.
    taps = torch.arange(-width, width + orig, dtype=dtype, device=waveform.device) / orig
    phases = torch.arange(0, -new, -1, dtype=dtype, device=waveform.device) / new
    t = ((phases[:, None] + taps[None, :]) * cutoff).clamp(-lowpass_filter_width, lowpass_filter_width)
    window = torch.cos(t * math.pi / lowpass_filter_width / 2) ** 2
    t = t * math.pi
    sinc = torch.where(t == 0, torch.ones_like(t), torch.sin(t) / t)
    kernel = (sinc * (window * (cutoff / orig)))[:, None, :]        # [new, 1, taps]
    shape = waveform.shape
    flat = waveform.reshape(-1, shape[-1])
    padded = F.pad(flat, (width, width + orig))
    out = F.conv1d(padded[:, None], kernel, stride=orig)            # [N, new, steps]
    out = out.transpose(1, 2).reshape(flat.shape[0], -1)[:, :math.ceil(new * shape[-1] / orig)]
    return out.reshape(*shape[:-1], out.shape[-1])


_TORCHAUDIO_SHIM = types.ModuleType("torchaudio")
_TORCHAUDIO_SHIM.functional = types.ModuleType("torchaudio.functional")
_TORCHAUDIO_SHIM.functional.resample = resample
_TOKENIZER_MODULE = "transformers.models.higgs_audio_v2_tokenizer.modeling_higgs_audio_v2_tokenizer"


def _tokenizer_module():
    """transformers' higgs tokenizer modeling module. It imports torchaudio (only for
    resample), which is absent here: then our `resample` stands in for it while the module
    imports, and is bound as the module's `torchaudio` from then on. A real torchaudio,
    when present, is used."""
    importlib.import_module("transformers")     # it probes for torchaudio: before any stand-in

    module = sys.modules.get(_TOKENIZER_MODULE)
    if module is None and ("torchaudio" in sys.modules
                           or importlib.util.find_spec("torchaudio") is not None):
        try:
            module = importlib.import_module(_TOKENIZER_MODULE)
        except (ImportError, OSError):      # a torchaudio built for another torch
            module = None
    if module is None:
        saved = sys.modules.get("torchaudio")
        sys.modules["torchaudio"] = _TORCHAUDIO_SHIM
        try:
            module = importlib.import_module(_TOKENIZER_MODULE)
        finally:
            if saved is None:
                sys.modules.pop("torchaudio", None)
            else:
                sys.modules["torchaudio"] = saved
    # An empty stand-in (another importer's) has no resample: ours replaces it.
    if not callable(getattr(getattr(module.torchaudio, "functional", None), "resample", None)):
        module.torchaudio = _TORCHAUDIO_SHIM
    return module


def _tokenizer_classes():
    from transformers.models.higgs_audio_v2_tokenizer.configuration_higgs_audio_v2_tokenizer import (
        HiggsAudioV2TokenizerConfig,
    )

    return _tokenizer_module().HiggsAudioV2TokenizerModel, HiggsAudioV2TokenizerConfig


def _legacy_tokenizer_model(raw: Mapping[str, Any], config_path: Path, weights_path: Path):
    """(config, transformers' HiggsAudioV2TokenizerModel) from boson's layout: the model is
    built from the equivalent transformers config and every tensor of the file is mapped
    onto it and loaded strictly. The semantic model's architecture is not in the file
    or in boson's config.json, only its weights: boson's code builds it from the hub by
    semantic_techer, and its two HuBERT teachers are HuBERT base, transformers' default
    HubertConfig (the one transformers' own conversion of this file uses). Other teachers
    (WavLM), and HuBERTs of other widths, raise CheckpointError."""
    tensors = _read_legacy_weights(weights_path)
    derived = _legacy_config(raw, config_path, tensors)
    cfg = _config_from(derived, config_path)
    fields = ConfigFields(raw, config_path)
    fields.str("semantic_techer", "hubert_base_general", choices=_BOSON_TEACHERS)
    fields.str("downsample_mode", "step_down", choices=("step_down",))   # transformers' way
    fields.str("merge_mode", "concat", choices=("concat",))
    model_class, config_class = _tokenizer_classes()
    semantic = derived["semantic_model_config"]
    if semantic["hidden_size"] != _SEMANTIC_HIDDEN_DEFAULT:
        raise CheckpointError(f"{weights_path}: the semantic features are {semantic['hidden_size']} "
                              f"wide, not HuBERT base's {_SEMANTIC_HIDDEN_DEFAULT}: encoding needs "
                              f"boson's HuBERT base teacher (decoding does not)")
    if "semantic_model.masked_spec_embed" in tensors:
        # Training-only (SpecAugment); HubertConfig's default masking creates it.
        semantic["mask_time_prob"] = 0.05
    try:
        config = config_class(**derived)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{config_path}: no transformers config follows from it ({exc})") from None
    with _no_init_weights():        # every tensor is loaded next: skip the random init
        model = model_class(config)
    weights = _from_legacy(tensors, model.state_dict(), cfg, weights_path, lambda key: True)
    load_strict(model, weights, f"{weights_path} (as transformers' HiggsAudioV2TokenizerModel)")
    return cfg, model


def _no_init_weights():
    try:
        from transformers.initialization import no_init_weights
    except ImportError:             # another transformers: initialising only costs time
        return contextlib.nullcontext()
    return no_init_weights()


class HiggsCodecEncoder:
    """Reference audio -> codes, for voice cloning: transformers' HiggsAudioV2TokenizerModel
    loaded once from the local folder (never downloaded), the decode-only parts dropped.
    A folder in boson-ai's layout is mapped onto that model (_legacy_tokenizer_model)."""

    def __init__(self, codec_dir: str | Path, device: str | torch.device = "cpu") -> None:
        root = require_dir(codec_dir, _WHAT)
        raw, weights_path = _codec_files(root)
        if weights_path.name == LEGACY_WEIGHTS_FILE:
            self.cfg, model = _legacy_tokenizer_model(raw, root / CONFIG_FILE, weights_path)
        else:
            self.cfg = _config_from(raw, root / CONFIG_FILE)
            model_class, _ = _tokenizer_classes()
            try:
                model = model_class.from_pretrained(str(root), local_files_only=True)
            except (OSError, ValueError, RuntimeError) as exc:
                raise CheckpointError(f"{root}: transformers cannot load the codec ({exc})") from None
        # encode() never touches these; dropping them frees the decoder's memory.
        for name in ("acoustic_decoder", "decoder_semantic", "fc1", "fc2"):
            setattr(model, name, nn.Identity())
        self.model = model.to(device=device, dtype=torch.float32).eval()
        self.device = torch.device(device)
        self.hop_length = self.cfg.hop_length
        self.sample_rate = self.cfg.sample_rate

    @torch.inference_mode()
    def encode(self, audio: np.ndarray) -> np.ndarray:
        """float32 mono audio at sample_rate (24 kHz) -> codes int64 [num_quantizers, T],
        T = len(audio) // hop_length: the audio is first cut to whole frames."""
        audio = np.asarray(audio, dtype=np.float32)
        if audio.ndim != 1:
            raise ValueError(f"expected mono audio of shape [samples], got {audio.shape}")
        usable = len(audio) // self.hop_length * self.hop_length
        if usable == 0:
            raise ValueError(f"reference audio of {len(audio)} samples is shorter than one "
                             f"codec frame ({self.hop_length} samples)")
        x = torch.from_numpy(np.ascontiguousarray(audio[:usable])).to(self.device)[None, None]
        codes = self.model.encode(x, return_dict=False)
        return codes[0].to(device="cpu", dtype=torch.int64).numpy()
