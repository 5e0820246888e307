"""Uploaded voices, kept on disk so that they survive restarts.

One folder per voice, named by the voice's case-folded name (names are checked against an
allow-list first, so a name can never be a path):

    <voices dir>/<name>/voice.json                 name, consent, created, transcript, ...
                        reference.<ext>             the recording as uploaded (if any)
                        features/<model>.safetensors  what <model>'s prompt stage computed

A voice is written whole into a temporary folder beside its final place and renamed into
place (rename is atomic on one filesystem), so a crash leaves the voice complete or absent,
never half-written; leftovers of interrupted writes are swept at start. Features computed
later for another model are written to a temporary file and renamed the same way.
Precomputed voices (folders in the same layout, e.g. copied from another server) can be
loaded read-only from further directories at start.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

logger = logging.getLogger("tritontts.frontend.voices")

MAX_NAME_CHARS = 64
# Letters, digits, space, _ - . ; no separators, no NUL, no leading dot (hidden, . and ..).
_NAME = re.compile(r"^[^\W_][\w .\-]*$")
_MODEL_FILE = re.compile(r"^[\w.\-]+$")
_TMP_PREFIX = ".tmp-"
_REFERENCE_FILE = re.compile(r"^reference\.[a-z0-9]{1,8}$")
_RUNTIME_FIELDS = ("path", "models", "kind", "memory_features")


class VoiceError(ValueError):
    """A voice request the store refuses; `status` is the HTTP status to answer."""

    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.status, self.param = status, param


def check_name(name: str) -> str:
    name = name.strip() if isinstance(name, str) else ""
    if not name:
        raise VoiceError("name is required: the name requests will use as their voice", param="name")
    if len(name) > MAX_NAME_CHARS:
        raise VoiceError(f"name is {len(name)} characters; the limit is {MAX_NAME_CHARS}", param="name")
    if ".." in name or not _NAME.match(name):
        raise VoiceError(f"name {name!r} may hold letters, digits, spaces, '_', '-' and '.', must "
                         "start with a letter or digit and may not contain '..'", param="name")
    return name


def voice_key(name: str) -> str:
    return name.casefold()


@dataclass
class StoredVoice:
    name: str
    consent: str
    created: int                        # unix seconds
    kind: str = "uploaded"              # uploaded | precomputed
    ref_text: str | None = None
    speaker_description: str | None = None
    source: str = "audio"               # audio | embedding
    mime_type: str | None = None
    file_size: int | None = None
    reference_file: str | None = None   # the recording's file name in the voice folder
    speaker_embedding: list[float] | None = None
    models: list[str] = field(default_factory=list)   # models with computed features
    path: Path | None = field(default=None, compare=False)
    # Features computed for a precomputed voice (whose folder is read-only to us).
    memory_features: dict[str, bytes] = field(default_factory=dict, compare=False, repr=False)

    def info(self, families: dict[str, str]) -> dict:
        """The listing entry (no server paths)."""
        models = sorted(self.models)
        return {"name": self.name, "kind": self.kind, "created": self.created,
                "created_at": self.created, "consent": self.consent,
                "families": sorted({families[m] for m in models if m in families}),
                "models": models, "ref_text": self.ref_text,
                "speaker_description": self.speaker_description, "embedding_source": self.source,
                "mime_type": self.mime_type, "file_size": self.file_size}

    def metadata(self) -> dict:
        data = asdict(self)
        for name in _RUNTIME_FIELDS:
            data.pop(name)
        return data


class VoiceStore:
    def __init__(self, root: Path | None, max_voices: int = 1000, preload: list[Path] = ()):
        """root None: voices live in memory only (nothing persists) - for tests of the front."""
        # Created on the first upload: a front nobody uploads to leaves no trace.
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="tritontts-voices-"))
        self.max_voices = max_voices
        self.voices: dict[str, StoredVoice] = {}
        self._lock = threading.Lock()
        for leftover in self.root.glob(_TMP_PREFIX + "*"):   # an interrupted write
            shutil.rmtree(leftover, ignore_errors=True)
        for directory in preload:
            self._load(Path(directory), "precomputed")
        if self.root.is_dir():
            self._load(self.root, "uploaded")

    def _load(self, directory: Path, kind: str) -> None:
        if not directory.is_dir():
            raise VoiceError(f"{directory}: voices directory not found")
        for folder in sorted(p for p in directory.iterdir() if p.is_dir()):
            if folder.name.startswith("."):
                continue
            try:
                data = json.loads((folder / "voice.json").read_text())
                voice = StoredVoice(**{k: v for k, v in data.items()
                                       if k in StoredVoice.__dataclass_fields__ and k not in _RUNTIME_FIELDS},
                                    kind=kind, path=folder)
                check_name(voice.name)
                if voice.reference_file is not None and not _REFERENCE_FILE.match(voice.reference_file):
                    raise ValueError(f"reference_file {voice.reference_file!r} is not reference.<ext>")
            except (OSError, ValueError, TypeError) as exc:
                logger.warning("skipping voice folder %s: %s", folder, exc)
                continue
            voice.models = sorted(p.stem for p in (folder / "features").glob("*.safetensors"))
            self.voices[voice_key(voice.name)] = voice

    def get(self, name: str) -> StoredVoice | None:
        return self.voices.get(voice_key(name)) if isinstance(name, str) else None

    def list(self) -> list[StoredVoice]:
        return sorted(self.voices.values(), key=lambda v: (v.created, v.name))

    def reference(self, voice: StoredVoice) -> bytes | None:
        if voice.reference_file is None or voice.path is None:
            return None
        return (voice.path / voice.reference_file).read_bytes()

    def features(self, voice: StoredVoice, model: str) -> bytes | None:
        """The model's features of the voice: computed since start (a precomputed voice's,
        kept in memory), else stored in its folder."""
        if model in voice.memory_features:
            return voice.memory_features[model]
        path = voice.path / "features" / f"{model}.safetensors" if voice.path else None
        return path.read_bytes() if path is not None and path.is_file() else None

    def check_new(self, name: str) -> None:
        if voice_key(name) in self.voices:
            raise VoiceError(f"voice {name!r} exists; delete it first "
                             f"(DELETE /v1/audio/voices/{name})", 409, "name")
        if len(self.voices) >= self.max_voices:
            raise VoiceError(f"{len(self.voices)} voices are stored, the limit (--max-voices); "
                             "delete some first", 409)

    def add(self, voice: StoredVoice, reference: bytes | None, extension: str,
            features: dict[str, bytes]) -> StoredVoice:
        with self._lock:
            self.check_new(voice.name)
            final = self.root / voice_key(voice.name)
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX, dir=self.root))
            try:
                if reference is not None:
                    voice.reference_file = f"reference.{extension}"
                    (tmp / voice.reference_file).write_bytes(reference)
                (tmp / "features").mkdir()
                for model, blob in features.items():
                    (tmp / "features" / f"{_model_file(model)}.safetensors").write_bytes(blob)
                (tmp / "voice.json").write_text(json.dumps(voice.metadata(), indent=1))
                _fsync_tree(tmp)
                if final.exists():      # a folder the store did not load (unreadable): replace
                    shutil.rmtree(final)
                os.rename(tmp, final)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            voice.path, voice.models, voice.kind = final, sorted(features), "uploaded"
            self.voices[voice_key(voice.name)] = voice
            return voice

    def add_features(self, voice: StoredVoice, model: str, blob: bytes) -> None:
        """Features computed after the upload (a model served later); precomputed voices
        keep theirs in memory only (their folder is not ours to write)."""
        with self._lock:
            if voice.kind == "uploaded" and voice.path is not None:
                target = voice.path / "features" / f"{_model_file(model)}.safetensors"
                fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=target.parent)
                with os.fdopen(fd, "wb") as f:
                    f.write(blob)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, target)
            else:
                voice.memory_features[model] = blob
            if model not in voice.models:
                voice.models = sorted([*voice.models, model])

    def delete(self, name: str) -> StoredVoice:
        with self._lock:
            voice = self.get(name)
            if voice is None:
                raise VoiceError(f"voice {name!r} does not exist", 404, "name")
            if voice.kind != "uploaded":
                raise VoiceError(f"voice {voice.name!r} is precomputed (loaded at start, read-only); "
                                 "remove it from that directory instead", 409, "name")
            # Rename away first: the voice is gone at once even if removing its files fails.
            doomed = self.root / f"{_TMP_PREFIX}deleted-{int(time.time() * 1e6)}"
            os.rename(voice.path, doomed)
            del self.voices[voice_key(voice.name)]
        shutil.rmtree(doomed, ignore_errors=True)
        return voice


def _model_file(model: str) -> str:
    if not _MODEL_FILE.match(model):
        raise VoiceError(f"model name {model!r} cannot name a file")
    return model


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
