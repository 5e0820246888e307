"""GLM-TTS's vocoders: 80-bin mel at 50 Hz, [B, 80, T] float32 -> audio [B, N] float32.

  hift/hift.pt                  CosyVoice2's non-causal HiFT, 24 kHz, 480 samples per frame:
                                tritontts.nn.hift.HiFTGenerator(causal=False), `load_hift`.
  vocos2d/generator_jit.ckpt    an optional Vocos2D, 32 kHz, 640 samples per frame, released
                                only as TorchScript (no source, no state dict): `load_vocos2d`.

Both loaders return a `Vocoder`, so the stage calls either the same way. Neither streams on
its own: GLM-TTS re-runs the vocoder on all mel so far and cross-fades.

The released hift.pt carries no config (upstream's utils/hift_util.py hard-codes it:
GLM_HIFT_CONFIG); `load_hift` reads the two widths from the weights, so the tiny random
checkpoints of `write_random_hift` load the same way.
"""
from __future__ import annotations

import math
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from ...weights.checkpoint import CheckpointError, read_torch_state_dict
from ...nn.hift import HiFTGenerator, load_hift_state_dict

__all__ = [
    "GLM_HIFT_CONFIG", "GLM_HIFT_TINY_CONFIG", "HIFT_CONFIGS", "MEL_LOGDIFF", "Vocoder",
    "Vocos2D", "load_hift", "load_vocos2d", "write_random_hift", "write_random_vocos2d",
]

# HiFTGenerator keyword arguments of GLM-TTS's hift.pt (upstream utils/hift_util.py).
GLM_HIFT_CONFIG: dict[str, Any] = dict(
    in_channels=80, base_channels=512, nb_harmonics=8, sampling_rate=24000, nsf_alpha=0.1,
    nsf_sigma=0.003, nsf_voiced_threshold=10, upsample_rates=(8, 5, 3),
    upsample_kernel_sizes=(16, 11, 7), istft_params={"n_fft": 16, "hop_len": 4},
    resblock_kernel_sizes=(3, 7, 11), resblock_dilation_sizes=((1, 3, 5),) * 3,
    source_resblock_kernel_sizes=(7, 7, 11), source_resblock_dilation_sizes=((1, 3, 5),) * 3,
    lrelu_slope=0.1, audio_limit=0.99,
    f0_predictor={"num_class": 1, "in_channels": 80, "cond_channels": 512},
    causal=False,
)
# The same network at widths 32 for tests and benchmarks (the rates, and so the audio
# length and sample rate, are the released model's).
GLM_HIFT_TINY_CONFIG: dict[str, Any] = {
    **GLM_HIFT_CONFIG, "base_channels": 32,
    "f0_predictor": {**GLM_HIFT_CONFIG["f0_predictor"], "cond_channels": 32},
}
HIFT_CONFIGS = {"tiny": GLM_HIFT_TINY_CONFIG, "released": GLM_HIFT_CONFIG}

# Vocos2D was trained on mel with another log offset (upstream utils/vocos_util.py).
MEL_LOGDIFF = -7.847762537473608
VOCOS2D_SAMPLE_RATE = 32000
VOCOS2D_SAMPLES_PER_MEL = 640


@runtime_checkable
class Vocoder(Protocol):
    """mel [B, 80, T] float32 -> audio [B, N] float32 at `sample_rate`, N nominally
    T * samples_per_mel. HiFTGenerator and Vocos2D are both nn.Modules (.to(device))."""

    sample_rate: int
    samples_per_mel: int

    def __call__(self, mel: Tensor) -> Tensor: ...


# --- HiFT -------------------------------------------------------------------------------

def _hift_config(base_channels: int, cond_channels: int) -> dict[str, Any]:
    return {**GLM_HIFT_CONFIG, "base_channels": base_channels,
            "f0_predictor": {**GLM_HIFT_CONFIG["f0_predictor"], "cond_channels": cond_channels}}


def _widths(state: dict[str, Tensor], path: Path) -> tuple[int, int]:
    """(base_channels, cond_channels) from conv_pre's and the f0 head's shapes, in any of
    the key forms load_hift_state_dict accepts."""
    def dim(prefix: str, axis: int, ndim: int) -> int:
        for key, value in state.items():
            name = key.removeprefix("generator.")
            if name.startswith(prefix) and value.ndim == ndim:
                return int(value.shape[axis])
        raise CheckpointError(f"{path}: no {prefix}* weight to read the vocoder's width from")

    # conv_pre's weight (or weight-norm direction) is [base_channels, 80, 7]; the f0 head is
    # Linear(cond_channels, 1).
    return dim("conv_pre.", 0, 3), dim("f0_predictor.classifier.weight", 1, 2)


def load_hift(path: str | Path) -> HiFTGenerator:
    """GLM-TTS's hift.pt (released or written by write_random_hift) as a HiFTGenerator in
    eval mode on the CPU; CheckpointError naming the file and the bad keys otherwise."""
    path = Path(path)
    state = read_torch_state_dict(path, "GLM-TTS HiFT vocoder")
    model = HiFTGenerator(**_hift_config(*_widths(state, path)))
    try:
        load_hift_state_dict(model, state)
    except CheckpointError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    except RuntimeError as exc:    # right keys, wrong shapes: torch lists them a line each
        problems = "; ".join(line.strip() for line in str(exc).splitlines()[1:])
        raise CheckpointError(f"{path}: hift state dict does not fit GLM-TTS's HiFT "
                              f"({problems or exc})") from None
    return model.eval()


def _weight_normed(name: str, value: Tensor) -> bool:
    # Upstream wraps every Conv1d / ConvTranspose1d in weight_norm except source_downs.
    return name.endswith(".weight") and value.ndim == 3 and not name.startswith("source_downs.")


def write_random_hift(path: str | Path, seed: int = 0, size: str = "tiny") -> Path:
    """A hift.pt of random weights in the released key layout (weight-normed convs as
    `.parametrizations.weight.original0/1`, as upstream's torch.nn.utils.parametrizations
    modules save them). The weights make audible, mostly unclipped output: unit-gain
    filters, a quiet conv_post (its first half is log-magnitude, fed to exp), and an f0 head
    around 40 Hz with a wide spread, so voiced and unvoiced (f0 <= 10 Hz) frames both occur."""
    if size not in HIFT_CONFIGS:
        raise ValueError(f"size must be one of {sorted(HIFT_CONFIGS)}, not {size!r}")
    path = Path(path)
    gen = torch.Generator().manual_seed(seed)
    state: dict[str, Tensor] = {}
    for name, like in HiFTGenerator(**HIFT_CONFIGS[size]).state_dict().items():
        shape = like.shape
        if name.endswith("alpha"):
            state[name] = 0.5 + torch.rand(shape, generator=gen)
        elif name == "f0_predictor.classifier.bias":
            state[name] = torch.full(shape, 40.0)
        elif name == "f0_predictor.classifier.weight":
            state[name] = torch.randn(shape, generator=gen) * 150 / math.sqrt(shape[1])
        elif _weight_normed(name, like):
            base = name.removesuffix(".weight") + ".parametrizations.weight."
            gain = 0.2 if name.startswith("conv_post.") else 1.0
            state[base + "original0"] = torch.full((shape[0], 1, 1), gain)
            state[base + "original1"] = torch.randn(shape, generator=gen)
        elif like.ndim > 1:
            value = torch.randn(shape, generator=gen)
            state[name] = value / value.flatten(1).norm(dim=1).view(-1, *[1] * (like.ndim - 1))
        else:
            state[name] = torch.randn(shape, generator=gen) * 0.05 \
                - (2.0 if name.startswith("conv_post.") else 0.0)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    return path


# --- Vocos2D (TorchScript) ----------------------------------------------------------------

class Vocos2D(nn.Module):
    """The TorchScript Vocos2D generator behind the Vocoder interface. It takes
    [B, T, 80] mel with Vocos2D's log offset and returns [B, N] audio at 32 kHz."""

    sample_rate = VOCOS2D_SAMPLE_RATE
    samples_per_mel = VOCOS2D_SAMPLES_PER_MEL

    def __init__(self, generator: torch.jit.ScriptModule) -> None:
        super().__init__()
        self.generator = generator

    @torch.inference_mode()
    def forward(self, mel: Tensor) -> Tensor:
        if mel.shape[2] == 1:
            # Upstream doubles a single frame (the generator needs two); the audio is then
            # two frames long, as upstream's.
            mel = torch.cat([mel, mel], dim=2)
        return self.generator(mel.transpose(1, 2) + MEL_LOGDIFF)


@contextmanager
def _torchscript_is_the_format():
    # torch deprecates TorchScript, but the released Vocos2D exists in no other form.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.jit")
        yield


def load_vocos2d(path: str | Path) -> Vocos2D:
    """vocos2d/generator_jit.ckpt (torch.jit.load: TorchScript runs TorchScript ops only, no
    pickled Python) in eval mode on the CPU; CheckpointError naming the file otherwise."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: GLM-TTS Vocos2D vocoder not found")
    try:
        with _torchscript_is_the_format():
            generator = torch.jit.load(str(path), map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - any failure is a bad file
        first_line = (str(exc).strip().splitlines() or [""])[0]
        raise CheckpointError(f"{path}: not a loadable TorchScript Vocos2D "
                              f"({type(exc).__name__}: {first_line})") from None
    return Vocos2D(generator).eval()


class _TinyMelToAudio(nn.Module):
    """A stand-in with Vocos2D's call signature ([B, T, 80] -> [B, T * 640]), for tests of
    the TorchScript path only: one linear map from each frame to its 640 samples."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(80, VOCOS2D_SAMPLES_PER_MEL)

    def forward(self, mel: Tensor) -> Tensor:
        return torch.tanh(self.proj(mel)).flatten(1)


def write_random_vocos2d(path: str | Path, seed: int = 0) -> Path:
    """A generator_jit.ckpt of _TinyMelToAudio with random weights (scripted)."""
    path = Path(path)
    torch.manual_seed(seed)
    with _torchscript_is_the_format():
        module = torch.jit.script(_TinyMelToAudio().eval())
    path.parent.mkdir(parents=True, exist_ok=True)
    module.save(str(path))
    return path
