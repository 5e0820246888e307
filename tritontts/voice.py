"""Voice features: what a family's prompt stage computes from a reference recording, packed
so that a stored voice skips that work on every request that names it.

The prompt stage of a family that clones (Family.voice_encoder names it) answers a request
that asks for its `voice_features` output alone with the reference's features: safetensors
bytes holding the arrays plus metadata (the family, the checkpoint's fingerprint, the
transcript). The front stores those bytes with the voice and sends them back, base64, as the
`voice_features` request parameter in place of ref_audio and ref_text.

Features are data from a client's point of view (anyone can send the parameter through
tritonclient), so the reading stage checks everything: names, dtypes, shapes, the family,
and the fingerprint of the checkpoint that computed them; a mismatch is a 400 that says to
upload the voice again, never features silently meeting another model.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import struct
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from .protocol import InvalidRequest

VOICE_FEATURES = "voice_features"     # the prompt stage's output and the request parameter
# The mode of a voice stored from a speaker embedding (not a recording: Family.voice_modes
# are a recording's).
EMBEDDING_MODE = "embedding"
MAX_VOICE_FEATURES_BYTES = 8 * 1024 * 1024
# Bytes read from the start of each weight file for the fingerprint: enough to tell
# checkpoints apart (weights differ from the first tensor on) without reading gigabytes.
_FINGERPRINT_HEAD = 1 << 20


def checkpoint_fingerprint(root: Path, names: Iterable[str]) -> str:
    """A short hash of the checkpoint files a voice's features depend on (the encoders and
    the tokenizer): their names, sizes and first megabyte."""
    digest = hashlib.sha256()
    for name in sorted(names):
        path = Path(root) / name
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            digest.update(str(file.relative_to(root)).encode() + b"\0")
            digest.update(str(file.stat().st_size).encode() + b"\0")
            with open(file, "rb") as f:
                digest.update(f.read(_FINGERPRINT_HEAD))
    return digest.hexdigest()[:16]


def pack_voice(family: str, fingerprint: str, arrays: dict[str, np.ndarray],
               **meta: str) -> bytes:
    """The arrays and metadata as safetensors bytes, the same bytes for the same features
    (canonical_safetensors): a voice computed twice (an upload, tritontts-voice precompute)
    is one file."""
    from safetensors.numpy import save

    header = {"family": family, "fingerprint": fingerprint, **meta}
    return canonical_safetensors(save({k: np.ascontiguousarray(v) for k, v in arrays.items()},
                                      metadata=header))


def canonical_safetensors(blob: bytes) -> bytes:
    """safetensors bytes with their header in one order: metadata keys sorted, tensors in
    the order of their data. The library writes the metadata from a hash map whose order
    changes from one call to the next, so the same arrays and metadata came out as
    different bytes. The data is untouched (its offsets count from the header's end)."""
    (size,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + size])
    ordered: dict[str, Any] = {}
    if "__metadata__" in header:
        ordered["__metadata__"] = dict(sorted(header.pop("__metadata__").items()))
    ordered.update(sorted(header.items(), key=lambda item: (item[1]["data_offsets"], item[0])))
    text = json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)         # the data stays 8-byte aligned, as the library keeps it
    return struct.pack("<Q", len(text)) + text + blob[8 + size:]


def voice_metadata(blob: bytes) -> dict[str, str]:
    """The metadata of packed features (no arrays are read)."""
    try:
        (size,) = struct.unpack("<Q", blob[:8])
        header = json.loads(blob[8:8 + size])
        meta = header.get("__metadata__") or {}
    except (struct.error, ValueError, AttributeError):
        raise InvalidRequest("voice_features are not packed voice features; upload the voice "
                             "again (POST /v1/audio/voices)") from None
    if not isinstance(meta, dict):
        raise InvalidRequest("voice_features carry no metadata; upload the voice again")
    return meta


def unpack_voice(blob: bytes, family: str, fingerprint: str,
                 spec: dict[str, tuple[Any, tuple[int | None, ...]]],
                 optional: Iterable[str] = ()) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The arrays of packed features, checked against `spec` (name -> (dtype, shape with None
    for any size)); names in `optional` may be absent. Raises InvalidRequest."""
    from safetensors.numpy import load

    meta = voice_metadata(blob)
    if meta.get("family") != family:
        raise InvalidRequest(f"voice_features were computed by {meta.get('family')!r}, not "
                             f"{family}: use a voice uploaded for {family}")
    if meta.get("fingerprint") != fingerprint:
        raise InvalidRequest(f"voice_features were computed by another {family} checkpoint; "
                             "upload the voice again for this one")
    try:
        arrays = load(blob)
    except Exception as exc:   # safetensors raises its own error types
        raise InvalidRequest(f"voice_features cannot be read: {exc}") from None
    optional = set(optional)
    unexpected = sorted(set(arrays) - set(spec))
    missing = sorted(set(spec) - set(arrays) - optional)
    if unexpected or missing:
        raise InvalidRequest(f"voice_features hold {sorted(arrays)}; expected {sorted(spec)}")
    for name, array in arrays.items():
        dtype, shape = spec[name]
        if array.dtype != np.dtype(dtype) or len(array.shape) != len(shape) or any(
                want is not None and got != want for got, want in zip(array.shape, shape)):
            raise InvalidRequest(f"voice_features {name!r} is {array.dtype}{list(array.shape)}; "
                                 f"expected {np.dtype(dtype)}{list(shape)}")
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise InvalidRequest(f"voice_features {name!r} holds NaN or Inf")
    return arrays, meta


def voice_features_param(value: Any) -> bytes:
    """The `voice_features` request parameter (base64) as bytes."""
    if not isinstance(value, str) or not value:
        raise InvalidRequest("voice_features must be base64 text, as stored with an uploaded voice")
    if len(value) * 3 // 4 > MAX_VOICE_FEATURES_BYTES:
        raise InvalidRequest(f"voice_features are larger than {MAX_VOICE_FEATURES_BYTES // 2**20} MiB")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest("voice_features must be base64 text") from None


MAX_REF_TEXT_CHARS = 4096


def transcribed_reference(params: dict[str, Any], family_label: str, transcript_required: bool = True
                          ) -> tuple[bytes | None, str | None, bytes | None]:
    """(ref_audio, ref_text, voice_features) of a family that clones from a recording and its
    transcript, checked together: ref_text needs ref_audio (and, with transcript_required,
    ref_audio needs ref_text), and a stored voice replaces both (its transcript is stored
    with it)."""
    from .protocol import audio_param

    ref_audio = audio_param(params["ref_audio"]) if params.get("ref_audio") is not None else None
    ref_text = params.get("ref_text")
    if ref_text is not None:
        if not isinstance(ref_text, str) or not ref_text.strip():
            raise InvalidRequest("ref_text must be non-empty text: the transcript of ref_audio")
        if len(ref_text) > MAX_REF_TEXT_CHARS:
            raise InvalidRequest(f"ref_text is {len(ref_text)} characters; the limit is {MAX_REF_TEXT_CHARS}")
        ref_text = ref_text.strip()
    features = (voice_features_param(params[VOICE_FEATURES])
                if params.get(VOICE_FEATURES) is not None else None)
    if features is not None and (ref_audio is not None or ref_text is not None):
        raise InvalidRequest("a stored voice (voice_features) replaces ref_audio and ref_text; "
                             "send one or the other")
    if transcript_required and ref_audio is not None and ref_text is None:
        raise InvalidRequest(f"ref_audio needs ref_text, its transcript ({family_label} clones from "
                             "the recording and what it says)")
    if ref_text is not None and ref_audio is None:
        raise InvalidRequest("ref_text is the transcript of ref_audio: send ref_audio with it")
    return ref_audio, ref_text, features


def blend_embeddings(vectors: list[np.ndarray], weights: list[float]) -> np.ndarray:
    """The weighted mean of speaker vectors, sum(w_i * v_i) / sum(w_i), computed in float64
    and returned as float32: the weights are shares, so A:0.7 B:0.3 and A:7 B:3 are one
    voice (to float32 rounding) and the blend stays on the scale of its parts (its length is not rescaled: the
    mean of two unlike vectors is shorter than either, as interpolating between them is).
    ValueError for weights that are not positive finite numbers (or sum to 0), or vectors
    of different lengths."""
    if not vectors or len(vectors) != len(weights):
        raise ValueError("a blend needs one weight per vector, and at least one vector")
    for w in weights:
        if not isinstance(w, (int, float)) or isinstance(w, bool) or not np.isfinite(w) or w <= 0:
            raise ValueError(f"weight {w!r} is not a positive number: weights must be positive "
                             "(a blend is a weighted mean of its voices)")
    total = float(sum(weights))
    if not total > 0:
        raise ValueError("the weights sum to 0; give positive weights")
    sizes = {np.asarray(v).reshape(-1).size for v in vectors}
    if len(sizes) != 1:
        raise ValueError(f"the voices' vectors differ in length ({sorted(sizes)}): blend voices of "
                         "one checkpoint")
    mixed = np.zeros(sizes.pop(), np.float64)
    for vector, weight in zip(vectors, weights):
        mixed += (float(weight) / total) * np.asarray(vector, np.float64).reshape(-1)
    return mixed.astype(np.float32)
