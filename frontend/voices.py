"""Uploaded voices, kept on disk: they survive restarts, and several fronts given the same
voices directory (e.g. a ReadWriteMany volume) share them as one store.

One folder per voice, named by the voice's case-folded name (names are checked against an
allow-list first, so a name can never be a path):

    <voices dir>/<name>/voice.json                 name, consent, created, transcript, ...
                        reference.<ext>             the recording as uploaded (if any)
                        features/<model>.safetensors  what <model>'s prompt stage computed

A voice is written whole into a temporary folder beside its final place (".tmp-*", which
no front ever reads as a voice) and renamed into place. Rename is atomic on one
filesystem, and renaming a folder onto a folder that is not empty fails, so a crash leaves
the voice complete or absent, never half-written, and of two uploads of one name (on two
fronts at once) exactly one lands; the other is a 409. An existing folder of that name is
never replaced: one that is not a readable voice (no or invalid voice.json) is a 409 that
names it, for an operator to remove. Features computed later for another model are written
to a temporary file in the voice's folder and renamed the same way; if the folder went
away meanwhile (the voice was deleted), they are not kept and the request goes on. Delete
renames the folder away (to ".tmp-deleted-*") before removing its files, so a voice is
gone at once even if removing them is cut short.

Sharing: the folder is the truth; a front keeps only a cache of what it read, checked
against the disk at each use:
- a voice uploaded on any front is found by name on every front as soon as its rename is
  done, i.e. before the uploading front answers (a name a front has not cached is read from
  <voices dir>/<name>/voice.json); the listing rescans the folder each time, so new voices
  appear and removed ones disappear;
- a deleted voice is absent on every front at its next use: each lookup stats the cached
  voice's voice.json (one stat), and a voice whose file is gone, or was replaced by a new
  upload of the name, is evicted (and the new one read);
- features one front computes for a model are read from the folder by every front;
- the --max-voices cap counts the voice folders on disk (two fronts uploading different
  names at the same instant may each pass it by one).
"At once" means as soon as the filesystem shows it to this front: a local or
POSIX-coherent filesystem does immediately; an NFS client caches lookups and attributes
for seconds unless mounted with lookupcache=none or actimeo=0 (docs/kubernetes.md).

Temporary leftovers (".tmp-*" folders of interrupted uploads or deletes, ".tmp-*" files in
features/) are swept at start and at each rescan, but only once older than STALE_TMP_S by
their modification time: another live front may be writing one right now.

The voices directory must be writable, checked at start (a VoiceError naming it): an
existing one by creating and removing a temporary folder in it (what access() says can be
wrong on network filesystems), a missing one by its nearest existing parent being a
writable directory (access()). The directory itself is created on the first upload, so a
front nobody uploads to leaves no trace.

tritontts-voice (frontend/voice_cli.py) writes folders in this layout offline, through this
store (read_only for its list and inspect: nothing swept). Precomputed voices (folders in
the same layout, e.g. copied from another server) can be loaded read-only from further directories at start; they are read once, not rescanned,
and features computed for them are kept in memory only.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

logger = logging.getLogger("tritontts.frontend.voices")

MAX_NAME_CHARS = 64
# Letters, digits, space, _ - . ; no separators, no NUL, no leading dot (hidden, . and ..).
_NAME = re.compile(r"^[^\W_][\w .\-]*$")
_MODEL_FILE = re.compile(r"^[\w.\-]+$")
_TMP_PREFIX = ".tmp-"
_REFERENCE_FILE = re.compile(r"^reference\.[a-z0-9]{1,8}$")
_RUNTIME_FIELDS = ("path", "models", "kind", "memory_features", "stamp")
# A temporary folder or file older than this (by mtime) is a leftover, not a write in
# progress: an upload writes its folder in well under a second once its features are
# computed. The margin also covers clock skew between the nodes of a shared volume.
STALE_TMP_S = 600.0


class VoiceError(ValueError):
    """A voice request the store refuses; `status` is the HTTP status to answer."""

    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.status, self.param = status, param


def default_voices_dir() -> Path:
    """TRITONTTS_VOICES_DIR, else the user's data directory (XDG)."""
    if os.environ.get("TRITONTTS_VOICES_DIR"):
        return Path(os.environ["TRITONTTS_VOICES_DIR"])
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "tritontts" / "voices"


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


def _folder_key(name: str) -> str | None:
    """The folder name of voice `name`, or None where `name` cannot be a stored voice's."""
    try:
        key = voice_key(check_name(name))
    except VoiceError:
        return None
    # Case folding keeps a checked name free of separators; checked again all the same.
    return key if _NAME.match(key) and ".." not in key else None


def check_writable(root: Path) -> None:
    """VoiceError (naming `root`) unless uploads can be written under it (module docstring)."""
    root = Path(root)
    if root.exists():
        if not root.is_dir():
            raise VoiceError(f"voices directory {root} is not a directory")
        try:
            os.rmdir(tempfile.mkdtemp(prefix=_TMP_PREFIX + "probe-", dir=root))
        except OSError as exc:
            raise VoiceError(f"voices directory {root} is not writable ({exc.strerror}); "
                             "give a writable --voices-dir") from None
        return
    parent = root.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise VoiceError(f"voices directory {root} cannot be created: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise VoiceError(f"voices directory {root} cannot be created: {parent} is not writable; "
                         "give a writable --voices-dir")


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
    duration: float | None = None       # seconds of the recording (None: not a recording)
    # How each model's features were computed at creation (Family.voice_modes, or
    # "embedding"); features computed later for another model follow the same rule.
    modes: dict[str, str] = field(default_factory=dict)
    # A blended voice's parts: [{"name", "weight" (normalised), "kind": preset | voice}].
    blend: list[dict] | None = None
    models: list[str] = field(default_factory=list)   # models with computed features
    path: Path | None = field(default=None, compare=False)
    # Features computed for a precomputed voice (whose folder is read-only to us).
    memory_features: dict[str, bytes] = field(default_factory=dict, compare=False, repr=False)
    # Which voice.json this was read from (device, inode, mtime, size): a cached voice
    # whose file no longer has it was deleted or replaced.
    stamp: tuple | None = field(default=None, compare=False, repr=False)

    def info(self, families: dict[str, str]) -> dict:
        """The listing entry (no server paths)."""
        models = sorted(self.models)
        return {"name": self.name, "kind": self.kind, "created": self.created,
                "created_at": self.created, "consent": self.consent,
                "families": sorted({families[m] for m in models if m in families}),
                "models": models, "ref_text": self.ref_text,
                "speaker_description": self.speaker_description, "embedding_source": self.source,
                "mime_type": self.mime_type, "file_size": self.file_size, "duration": self.duration,
                "modes": dict(self.modes), **({"blend": self.blend} if self.blend else {})}

    def metadata(self) -> dict:
        data = asdict(self)
        for name in _RUNTIME_FIELDS:
            data.pop(name)
        return data


class VoiceStore:
    def __init__(self, root: Path | None, max_voices: int = 1000, preload: list[Path] = (),
                 stale_tmp_s: float = STALE_TMP_S, read_only: bool = False):
        """root None: voices live in a fresh temporary folder (nothing persists) - for tests
        of the front. VoiceError if root cannot be written or a preload directory is missing.
        read_only: the root is only read (tritontts-voice list, inspect): not checked for
        writing, nothing swept, add and delete refused."""
        self.read_only = read_only
        if root is None:
            self.root = Path(tempfile.mkdtemp(prefix="tritontts-voices-"))
        else:
            self.root = Path(root)
            if not read_only:
                check_writable(self.root)
        self.max_voices = max_voices
        self.stale_tmp_s = stale_tmp_s
        self.uploaded: dict[str, StoredVoice] = {}       # a cache of the root's folders
        self.precomputed: dict[str, StoredVoice] = {}
        self._warned: set[tuple] = set()
        self._lock = threading.RLock()
        for directory in preload:
            self.precomputed.update(self._scan_preloaded(Path(directory)))
        self.list()         # sweeps stale leftovers, logs unreadable folders once

    # --- reading -------------------------------------------------------------------------
    def _read(self, folder: Path, kind: str, stamp: tuple | None) -> StoredVoice | None:
        try:
            data = json.loads((folder / "voice.json").read_text())
            voice = StoredVoice(**{k: v for k, v in data.items()
                                   if k in StoredVoice.__dataclass_fields__ and k not in _RUNTIME_FIELDS},
                                kind=kind, path=folder, stamp=stamp)
            check_name(voice.name)
            if not isinstance(voice.modes, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in voice.modes.items()):
                raise ValueError("its modes are not a {model: mode} table")
            if voice.duration is not None and (isinstance(voice.duration, bool)
                                               or not isinstance(voice.duration, (int, float))):
                raise ValueError("its duration is not a number of seconds")
            if voice.blend is not None and not isinstance(voice.blend, list):
                raise ValueError("its blend is not a list of parts")
            if voice.reference_file is not None and not _REFERENCE_FILE.match(voice.reference_file):
                raise ValueError(f"reference_file {voice.reference_file!r} is not reference.<ext>")
            if kind == "uploaded" and voice_key(voice.name) != folder.name:
                raise ValueError(f"its voice {voice.name!r} belongs in a folder named "
                                 f"{voice_key(voice.name)!r}")
        except (OSError, ValueError, TypeError) as exc:
            if (folder, stamp) not in self._warned:
                self._warned.add((folder, stamp))
                logger.warning("skipping voice folder %s: %s", folder, exc)
            return None
        voice.models = self._models(folder)
        return voice

    def _scan_preloaded(self, directory: Path) -> dict[str, StoredVoice]:
        if not directory.is_dir():
            raise VoiceError(f"{directory}: voices directory not found")
        found = {}
        for folder in sorted(p for p in directory.iterdir() if p.is_dir()):
            if not folder.name.startswith("."):
                voice = self._read(folder, "precomputed", None)
                if voice is not None:
                    found[voice_key(voice.name)] = voice
        return found

    def _models(self, folder: Path) -> list[str]:
        """The models whose features the folder holds (stale temporary files swept)."""
        models = []
        try:
            entries = list(os.scandir(folder / "features"))
        except OSError:
            return []
        for entry in entries:
            if entry.name.startswith(_TMP_PREFIX):
                self._sweep_if_stale(Path(entry.path))
            elif entry.name.endswith(".safetensors"):
                models.append(entry.name[:-len(".safetensors")])
        return sorted(models)

    def _uploaded(self, key: str) -> StoredVoice | None:
        """The root's voice in folder `key` as the disk has it now (the cached one while its
        voice.json is the one it was read from)."""
        folder = self.root / key
        stamp = _stamp(folder / "voice.json")
        cached = self.uploaded.get(key)
        if stamp is None:
            self.uploaded.pop(key, None)
            return None
        if cached is not None and cached.stamp == stamp:
            return cached
        voice = self._read(folder, "uploaded", stamp)
        if voice is None:
            self.uploaded.pop(key, None)
            return None
        self.uploaded[key] = voice
        return voice

    def get(self, name: str) -> StoredVoice | None:
        key = _folder_key(name) if isinstance(name, str) else None
        if key is None:
            return None
        with self._lock:
            return self._uploaded(key) or self.precomputed.get(key)

    def list(self) -> list[StoredVoice]:
        """Every voice, the root rescanned (stale leftovers swept on the way)."""
        with self._lock:
            seen: dict[str, StoredVoice] = {}
            for entry in self._entries():
                if entry.name.startswith(_TMP_PREFIX):
                    self._sweep_if_stale(Path(entry.path))
                elif not entry.name.startswith(".") and entry.is_dir():
                    voice = self._uploaded(entry.name)
                    if voice is not None:
                        voice.models = self._models(voice.path)
                        seen[entry.name] = voice
            self.uploaded = seen
            voices = {**self.precomputed, **seen}
        return sorted(voices.values(), key=lambda v: (v.created, v.name))

    def _entries(self) -> list[os.DirEntry]:
        try:
            return list(os.scandir(self.root))
        except FileNotFoundError:
            return []       # nothing uploaded yet

    def _sweep_if_stale(self, path: Path) -> None:
        if self.read_only:
            return
        try:
            age = time.time() - path.lstat().st_mtime
        except OSError:
            return          # removed meanwhile
        if age < self.stale_tmp_s:
            return          # perhaps being written by a live front
        logger.info("removing %s, left by an interrupted write %.0f s ago", path, age)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                path.unlink()
            except OSError:
                pass

    def reference(self, voice: StoredVoice) -> bytes | None:
        if voice.reference_file is None or voice.path is None:
            return None
        try:
            return (voice.path / voice.reference_file).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            raise VoiceError(f"voice {voice.name!r} was deleted meanwhile", 404, "voice") from None

    def features(self, voice: StoredVoice, model: str) -> bytes | None:
        """The model's features of the voice: computed since start (a precomputed voice's,
        kept in memory), else stored in its folder (by whichever front computed them)."""
        if model in voice.memory_features:
            return voice.memory_features[model]
        if voice.path is None:
            return None
        try:
            return (voice.path / "features" / f"{_model_file(model)}.safetensors").read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None

    # --- writing -------------------------------------------------------------------------
    def check_new(self, name: str) -> None:
        """VoiceError 409 unless a voice `name` may be uploaded now (as the disk has it)."""
        key = voice_key(name)
        if self.read_only:
            raise VoiceError(f"voices directory {self.root} is open read-only")
        with self._lock:
            existing = self._uploaded(key) or self.precomputed.get(key)
            if existing is not None:
                raise VoiceError(_exists(existing), 409, "name")
            folder = self.root / key
            if os.path.lexists(folder):
                logger.warning("upload of %r refused: %s exists but is not a readable voice", name, folder)
                raise VoiceError(f"the voices directory holds a folder {key!r} that is not a readable "
                                 f"voice (no or invalid voice.json); remove that folder from the "
                                 f"voices directory (--voices-dir), then upload again", 409, "name")
            count = sum(1 for e in self._entries() if not e.name.startswith(".") and e.is_dir())
            if count >= self.max_voices:
                raise VoiceError(f"{count} voices are stored, the limit (--max-voices); "
                                 "delete some first", 409)

    def add(self, voice: StoredVoice, reference: bytes | None, extension: str,
            features: dict[str, bytes]) -> StoredVoice:
        key = voice_key(voice.name)
        with self._lock:
            self.check_new(voice.name)
            final = self.root / key
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
                try:
                    os.rename(tmp, final)   # fails onto a folder that is not empty: never replaces
                except OSError as exc:
                    if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                        raise
                    # Another front (or an operator) put something there since check_new.
                    winner = self._uploaded(key)
                    raise VoiceError(_exists(winner) if winner else
                                     f"voice {voice.name!r} is being uploaded elsewhere at the same "
                                     "time; retry, or choose another name", 409, "name") from None
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            _fsync_dir(self.root)
            voice.path, voice.models, voice.kind = final, sorted(features), "uploaded"
            voice.stamp = _stamp(final / "voice.json")
            self.uploaded[key] = voice
            return voice

    def add_features(self, voice: StoredVoice, model: str, blob: bytes) -> None:
        """Features computed after the upload (a model served later), written into the
        voice's folder for every front; precomputed voices keep theirs in memory only (their
        folder is not ours to write). A voice deleted (or replaced) meanwhile by another
        front gets nothing written: logged, and the request that computed them goes on."""
        with self._lock:
            if voice.kind != "uploaded" or voice.path is None:
                voice.memory_features[model] = blob
            elif not self._write_features(voice, model, blob):
                return
            if model not in voice.models:
                voice.models = sorted([*voice.models, model])

    def _write_features(self, voice: StoredVoice, model: str, blob: bytes) -> bool:
        target = voice.path / "features" / f"{_model_file(model)}.safetensors"
        if _stamp(voice.path / "voice.json") != voice.stamp:
            logger.warning("voice %r was deleted or replaced meanwhile: its %s features are not "
                           "kept", voice.name, model)
            self.uploaded.pop(voice_key(voice.name), None)
            return False
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=target.parent)
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except (FileNotFoundError, NotADirectoryError):
            # Deleted between the check and the write (its folder renamed away, then removed).
            logger.warning("voice %r was deleted meanwhile: its %s features are not kept",
                           voice.name, model)
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
            self.uploaded.pop(voice_key(voice.name), None)
            return False
        return True

    def delete(self, name: str) -> StoredVoice:
        if self.read_only:
            raise VoiceError(f"voices directory {self.root} is open read-only")
        with self._lock:
            voice = self.get(name)
            if voice is None:
                raise VoiceError(f"voice {name!r} does not exist", 404, "name")
            if voice.kind != "uploaded":
                raise VoiceError(f"voice {voice.name!r} is precomputed (loaded at start, read-only); "
                                 "remove it from that directory instead", 409, "name")
            key = voice_key(voice.name)
            self.uploaded.pop(key, None)
            # Rename away first: the voice is gone at once, on every front, even if removing
            # its files fails. Unique across fronts, so two deletes never meet there.
            doomed = self.root / f"{_TMP_PREFIX}deleted-{uuid.uuid4().hex}"
            try:
                os.rename(voice.path, doomed)
            except (FileNotFoundError, NotADirectoryError):
                raise VoiceError(f"voice {name!r} does not exist (deleted meanwhile)", 404, "name") from None
        shutil.rmtree(doomed, ignore_errors=True)
        return voice


def _exists(voice: StoredVoice) -> str:
    if voice.kind != "uploaded":
        return (f"voice {voice.name!r} exists as a precomputed voice (read-only, --preload-voices); "
                "choose another name")
    return f"voice {voice.name!r} exists; delete it first (DELETE /v1/audio/voices/{voice.name})"


def _stamp(path: Path) -> tuple | None:
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        logger.warning("cannot read %s: %s", path, exc)
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


def _model_file(model: str) -> str:
    if not _MODEL_FILE.match(model):
        raise VoiceError(f"model name {model!r} cannot name a file")
    return model


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())


def _fsync_dir(folder: Path) -> None:
    """The rename itself made durable (best effort: not every filesystem fsyncs a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
