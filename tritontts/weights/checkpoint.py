"""What every family's checkpoint loader shares: one error type that names the file, one
check for the files a layout needs, one strict state-dict load, one cache folder."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable


def cache_root(given: str | Path | None = None) -> Path:
    """Where conversions and exports made from checkpoints are kept: `given`, else
    $TRITONTTS_CACHE, else ~/.cache/tritontts."""
    return Path(given or os.environ.get("TRITONTTS_CACHE") or Path.home() / ".cache" / "tritontts")


def publish_dir(out: Path, fill: Callable[[Path], None]) -> Path:
    """Make folder `out` atomically: `fill` writes it under a temporary name, then it is
    renamed into place (a concurrent maker, e.g. another instance, may win: its folder
    stays). Nothing is done when `out` already exists."""
    if out.is_dir():
        return out
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    fill(tmp)
    try:
        tmp.rename(out)
    except OSError:  # another process made it first
        for f in tmp.iterdir():
            f.unlink()
        tmp.rmdir()
    return out


class CheckpointError(ValueError):
    """A checkpoint file is missing or malformed; the message names the file."""


def require_dir(root: str | Path, what: str) -> Path:
    root = Path(root).expanduser().resolve()
    if not root.is_dir():
        raise CheckpointError(f"{root}: {what} checkpoint directory not found")
    return root


def require_files(root: Path, names: Iterable[str], what: str) -> None:
    for name in names:
        if not (root / name).is_file():
            raise CheckpointError(f"{root / name}: missing from the {what} checkpoint")


def require_tokenizer(root: Path) -> None:
    """A Hugging Face BPE tokenizer: tokenizer.json, or vocab.json + merges.txt."""
    if not (root / "tokenizer.json").is_file() and not (
            (root / "vocab.json").is_file() and (root / "merges.txt").is_file()):
        raise CheckpointError(f"{root}: the text tokenizer needs tokenizer.json or vocab.json + merges.txt")


def require_json_objects(folder: Path, names: Iterable[str]) -> None:
    """Files that must each hold a JSON object (a sub-model's config, its preprocessor's)."""
    for name in names:
        if not isinstance(read_json(folder / name), dict):
            raise CheckpointError(f"{folder / name}: expected a JSON object")


def load_strict(module, state_dict, what: str) -> None:
    """Load a state dict that matches the module exactly; otherwise raise CheckpointError
    naming every missing, unexpected and wrongly shaped key (nothing is loaded then)."""
    expected = module.state_dict()
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    mismatched = sorted(f"{k} {tuple(state_dict[k].shape)} vs {tuple(expected[k].shape)}"
                        for k in set(expected) & set(state_dict)
                        if tuple(state_dict[k].shape) != tuple(expected[k].shape))
    if missing or unexpected or mismatched:
        parts = [f"{label}: {', '.join(keys)}" for label, keys in
                 (("missing keys", missing), ("unexpected keys", unexpected),
                  ("shape mismatches", mismatched)) if keys]
        raise CheckpointError(f"{what} does not match the model; " + "; ".join(parts))
    module.load_state_dict(dict(state_dict), strict=True)


# Weight-norm pairs (g, v) as torch's parametrization and as the older hook store them.
_WEIGHT_NORM = ((".parametrizations.weight.original0", ".parametrizations.weight.original1"),
                (".weight_g", ".weight_v"))


def fold_weight_norm(state: dict, what: str) -> dict:
    """Each weight-norm pair replaced by the weight it stands for, g v / |v| with the norm
    over all but dim 0 (torch's default: dim 0 is the output channel of a conv, the input
    channel of a transposed conv), computed in float64 and stored in v's dtype. Shared by the
    loaders whose releases keep weight norm unfolded (Gepard's NanoCodec, AuK's VAE); a g
    without its v raises CheckpointError naming both (`what` says which file)."""
    out = dict(state)
    for g_suffix, v_suffix in _WEIGHT_NORM:
        for key in [k for k in out if k.endswith(g_suffix)]:
            stem = key[:-len(g_suffix)]
            if stem + v_suffix not in out:
                raise CheckpointError(f"{what}: {key} without its {stem + v_suffix}")
            g, v = out.pop(key), out.pop(stem + v_suffix)
            norm = v.double().flatten(1).norm(dim=1).view(-1, *(1,) * (v.ndim - 1))
            out[stem + ".weight"] = (g.double() * v.double() / norm).to(v.dtype)
    return out


def read_torch_checkpoint(path: Path, what: str):
    """A torch.save'd file's contents. weights_only=True unpickles tensors and plain
    containers only, so a crafted file fails here instead of running code; errors name the
    file and say it is `what`."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: {what} not found")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure is a bad file
        first_line = (str(exc).strip().splitlines() or [""])[0]
        raise CheckpointError(f"{path}: {what} is not a loadable torch state dict "
                              f"({type(exc).__name__}: {first_line})") from None


def read_torch_state_dict(path: Path, what: str) -> dict:
    """A torch.save'd dict of tensors by name (read_torch_checkpoint), checked."""
    import torch

    state = read_torch_checkpoint(path, what)
    if not isinstance(state, dict) or not state or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise CheckpointError(f"{path}: {what} should be a non-empty dict of tensors by name, "
                              f"got {type(state).__name__}")
    return state


# A ConfigFields default meaning: the field must be present.
REQUIRED = object()


class ConfigFields:
    """One JSON object of a checkpoint file, read field by field; errors name the file and
    the field's path (talker_config.code_predictor_config.hidden_size)."""

    def __init__(self, data: Any, path: Path, where: str = ""):
        if not isinstance(data, dict):
            raise CheckpointError(f"{path}: {where.rstrip('.') or 'the file'} must be a JSON object")
        self.data, self.path, self.where = data, path, where

    def fail(self, name: str, problem: str):
        raise CheckpointError(f"{self.path}: {self.where}{name} {problem}")

    def has(self, name: str) -> bool:
        return self.data.get(name) is not None

    def _get(self, name: str, default):
        value = self.data.get(name)
        if value is None:
            if default is REQUIRED:
                self.fail(name, "is missing")
            return default, False
        return value, True

    def int(self, name: str, default=REQUIRED, low: int | None = None):
        value, present = self._get(name, default)
        if present:
            if isinstance(value, bool) or not isinstance(value, int):
                self.fail(name, f"must be an integer, got {value!r}")
            if low is not None and value < low:
                self.fail(name, f"must be at least {low}, got {value}")
        return value

    def float(self, name: str, default=REQUIRED, positive: bool = False):
        value, present = self._get(name, default)
        if present:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                self.fail(name, f"must be a number, got {value!r}")
            if positive and not value > 0:
                self.fail(name, f"must be positive, got {value}")
            value = float(value)
        return value

    def bool(self, name: str, default=REQUIRED):
        value, present = self._get(name, default)
        if present and not isinstance(value, bool):
            self.fail(name, f"must be true or false, got {value!r}")
        return value

    def str(self, name: str, default=REQUIRED, choices: tuple[str, ...] | None = None):
        value, present = self._get(name, default)
        if present:
            if not isinstance(value, str):
                self.fail(name, f"must be a string, got {value!r}")
            if choices is not None and value not in choices:
                self.fail(name, f"is {value!r}; expected one of {list(choices)}")
        return value

    def ints(self, name: str, default=REQUIRED):
        value, present = self._get(name, default)
        if present and (not isinstance(value, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in value)):
            self.fail(name, f"must be a list of integers, got {value!r}")
        return tuple(value) if present else value

    def floats(self, name: str, default=REQUIRED):
        value, present = self._get(name, default)
        if present and (not isinstance(value, list) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
            self.fail(name, f"must be a list of numbers, got {value!r}")
        return tuple(float(v) for v in value) if present else value

    def object(self, name: str, default=REQUIRED) -> "ConfigFields | None":
        value, present = self._get(name, default)
        if not present:
            return None if value is None else ConfigFields(value, self.path, f"{self.where}{name}.")
        if not isinstance(value, dict):
            self.fail(name, "must be a JSON object")
        return ConfigFields(value, self.path, f"{self.where}{name}.")


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not readable JSON ({exc})") from None


def read_tensors(path: Path, prefix: str, strip: bool = True, skip: tuple[str, ...] = ()) -> dict:
    """The tensors of a safetensors file whose names start with `prefix` (prefix removed when
    `strip`) and not with any of `skip`; only those are read (a codec's or a talker's slice of
    one big file; a VAE without its training-only tensors)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            cut = len(prefix) if strip else 0
            return {k[cut:]: f.get_tensor(k) for k in f.keys()
                    if k.startswith(prefix) and not (skip and k.startswith(skip))}
    except Exception as exc:  # noqa: BLE001 - any failure is a bad file
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None


def safetensors_files(root: Path, what: str, single: str = "model.safetensors",
                      index: str = "model.safetensors.index.json") -> tuple[Path, ...]:
    """A Hugging Face checkpoint's weights: `single`, or the shards the `index` file's
    weight_map names (each must be a file in `root`)."""
    if (root / single).is_file():
        return (root / single,)
    index_path = root / index
    if not index_path.is_file():
        raise CheckpointError(f"{root / single}: missing from the {what} checkpoint (and no {index} naming shards)")
    fields = ConfigFields(read_json(index_path), index_path)
    weight_map = fields.object("weight_map").data
    shards = sorted({v for v in weight_map.values() if isinstance(v, str)})
    if not shards or len(shards) != len(set(weight_map.values())):
        fields.fail("weight_map", "must map tensor names to shard file names")
    files = []
    for shard in shards:
        path = (root / shard).resolve()
        if path.parent != root or not path.is_file():
            raise CheckpointError(f"{root / shard}: shard named by {index} is missing")
        files.append(path)
    return tuple(files)


def weight_names(path: Path) -> frozenset[str]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            return frozenset(f.keys())
    except Exception as exc:  # noqa: BLE001 - any failure is a bad file
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None


def engine_folder(kind: str, weights: Iterable[Path], config: dict, files: dict[str, str] | None = None,
                  cache_root_dir: str | Path | None = None) -> Path:
    """The folder a talker's vLLM engine loads, made once per set of weights (keyed by their
    paths, sizes and times) under cache_root/<kind>/: `config` as config.json, `files`
    (name -> text) beside it, and links to the weight files (nothing is copied or converted)."""
    import hashlib

    weights = [Path(w) for w in weights]
    stamp = "|".join(f"{w.resolve()}:{w.stat().st_size}:{w.stat().st_mtime_ns}" for w in weights)
    out = cache_root(cache_root_dir) / kind / hashlib.sha256(stamp.encode()).hexdigest()[:16]
    if (out / "config.json").is_file():
        return out

    def fill(folder: Path) -> None:
        (folder / "config.json").write_text(json.dumps(config, indent=2))
        for name, text in (files or {}).items():
            (folder / name).write_text(text)
        for w in weights:
            (folder / w.name).symlink_to(w.resolve())

    return publish_dir(out, fill)
