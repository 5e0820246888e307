"""tritontts-voice: the front's voices directory, offline (no server needed).

    tritontts-voice modes [--family FAMILY]
    tritontts-voice precompute --family FAMILY --checkpoint DIR --voices-dir DIR --name NAME \\
        --audio FILE --consent TEXT [--ref-text TEXT | --ref-text-file FILE] [--mode MODE] [--model MODEL]
    tritontts-voice blend --family FAMILY --checkpoint DIR --voices-dir DIR --name NAME [--model MODEL] \\
        A:0.7 B:0.3
    tritontts-voice list --voices-dir DIR [--json]
    tritontts-voice inspect --voices-dir DIR NAME [--family FAMILY --checkpoint DIR]
    tritontts-voice delete --voices-dir DIR NAME

`precompute` runs the family's own voice encoder (the prompt stage its descriptor names in
Family.voice_encoder, the class that stage's config.pbtxt names, built with its config
parameters as Triton builds it) in this process on the checkpoint, and hands it the request
an upload to the front sends (serving.recording_params), so the features it writes are the
ones POST /v1/audio/voices stores for the same recording, byte for byte (on the same device
and torch threads: the stage's config, CPU unless --device). The voice is written into the
--voices-dir layout (frontend/voices.py) by the store the front uses: a front serving that
directory (or --preload-voices of a copy) speaks it by name, as soon as it is written.
--model names the served model the features are for (FAMILY, or FAMILY-SUFFIX for another
checkpoint served beside it); they carry the checkpoint's fingerprint, so a front whose
model has another checkpoint answers 400 "upload the voice again" rather than misusing them.

`blend` makes a voice from a weighted mean of speaker vectors where the family speaks from
one (Family.speaker_embeddings): the checkpoint's preset speakers and stored voices (their
features' vector for --model, or the speaker_embedding they were uploaded with). The weights
are shares (tritontts.voice.blend_embeddings): A:0.7 B:0.3 equals A:7 B:3. The voice is
stored as an upload with that speaker_embedding would be.

Every refusal is exit status 2 with a message on stderr that says what to fix; the messages
for a recording are the ones the upload route's 400 gives for it.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from tritontts.families import FAMILIES, family_of
from tritontts.family import Family
from tritontts.protocol import InvalidRequest
from tritontts.voice import EMBEDDING_MODE, blend_embeddings, voice_metadata
from tritontts.weights.checkpoint import CheckpointError

from .serving import SpeechError, embedding_params, recording_params
from .voice_api import (
    EXTENSIONS, MAX_CONSENT_CHARS, MAX_DESCRIPTION_CHARS, MAX_REF_TEXT_CHARS, audio_extension,
    check_recording, check_text_field, check_upload_size)
from .voices import StoredVoice, VoiceError, VoiceStore, check_name, default_voices_dir

# No cap here: the front's --max-voices counts the folders when it uploads.
UNCAPPED = 1 << 40


class CliError(Exception):
    """Bad input: printed, exit status 2."""


def _fail(exc: BaseException) -> CliError:
    return CliError(exc.message if isinstance(exc, SpeechError) else str(exc))


# --- the family, its checkpoint, its voice encoder ------------------------------------------

def family_named(name: str, *, clones: bool = False) -> Family:
    family = FAMILIES.get(name)
    cloning = sorted(f.name for f in FAMILIES.values() if f.voice_encoder)
    if family is None:
        raise CliError(f"unknown family {name!r}; families: {', '.join(FAMILIES)} "
                       f"(those that clone voices: {', '.join(cloning)})")
    if clones and family.voice_encoder is None:
        raise CliError(f"{name} does not clone voices; families that do: {', '.join(cloning)}")
    return family


def model_of(family: Family, model: str | None) -> str:
    model = model or family.name
    if family_of(model) is not family:
        raise CliError(f"model {model!r} is not a model name of {family.name}: {family.name}, or "
                       f"{family.name}-SUFFIX for another checkpoint served beside it")
    return model


def open_checkpoint(family: Family, path: Path) -> None:
    """The checkpoint read by the family's reader, as the launcher checks it before start."""
    if family.open_checkpoint is None:
        return
    try:
        family.open_checkpoint(path)
    except CheckpointError as exc:
        raise CliError(f"{path} is not a {family.name} checkpoint: {exc}") from None
    except OSError as exc:
        raise CliError(f"{path}: {exc.strerror or exc}") from None


def voice_encoder(family: Family, checkpoint: Path, model: str, device: str = "cpu"):
    """The family's voice encoder stage on `checkpoint`, built as Triton builds it: the
    class its config.pbtxt names, with that config's parameters and the checkpoint as its
    `checkpoint` parameter (how a served model's stages find theirs)."""
    import os

    from tritontts.deploy.repository import STAGE_REPOSITORY, read_config, served_model_stage
    from tritontts.serving.stage import STAGE_THREAD_ENV, Stage, StageContext

    # The thread environment of a served stage's process, set before the stage's libraries
    # load (torch reads it at import): float results follow the thread count.
    for variable, value in STAGE_THREAD_ENV.items():
        os.environ.setdefault(variable, value)
    if "torch" in sys.modules:          # already loaded (a caller in process): set it directly
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    folder = STAGE_REPOSITORY / family.voice_encoder
    config = read_config(folder / "config.pbtxt")
    parameters = {k: v.string_value for k, v in config.parameters.items()}
    module, _, name = parameters.get("stage", "").partition(":")
    cls = getattr(importlib.import_module(module), name, None) if module else None
    if not (isinstance(cls, type) and issubclass(cls, Stage)):
        raise RuntimeError(f"{folder / 'config.pbtxt'}: its `stage` parameter names no Stage class")
    parameters["checkpoint"] = str(checkpoint)
    context = StageContext(served_model_stage(model, family, family.voice_encoder), folder,
                           parameters=parameters, device=device)
    try:
        return cls(context)
    except CheckpointError as exc:
        raise CliError(f"{checkpoint} is not a {family.name} checkpoint: {exc}") from None


def encode(stage, model: str, params: dict[str, Any]) -> bytes:
    """What the stage answers a request for its voice_features output alone, with the
    tensors the front sends (text "", voice "default", params as JSON)."""
    import numpy as np

    from tritontts.serving.stage import Inputs

    inputs = Inputs(text=np.array([b""], object), voice=np.array([b"default"], object),
                    params=np.array([json.dumps(params).encode()], object))
    try:
        return stage.encode_voice(inputs)
    except InvalidRequest as exc:
        raise CliError(f"{model}: {exc}") from None


# --- the voices directory -------------------------------------------------------------------

def writable_store(root: Path) -> VoiceStore:
    try:
        return VoiceStore(root, max_voices=UNCAPPED)
    except VoiceError as exc:
        raise _fail(exc) from None


def readable_store(root: Path) -> VoiceStore:
    if not root.is_dir():
        raise CliError(f"voices directory {root} does not exist")
    return VoiceStore(root, max_voices=UNCAPPED, read_only=True)


def new_name(store: VoiceStore, name: str) -> str:
    """The checked name, free in the store (as the upload checks it)."""
    try:
        name = check_name(name)
        store.check_new(name)
    except VoiceError as exc:
        message = str(exc)
        if exc.status == 409 and "DELETE /v1/audio/voices" in message:
            message += f" or tritontts-voice delete --voices-dir {store.root} {name!r}"
        raise CliError(message) from None
    return name


def not_builtin(name: str, family: Family, checkpoint: Path, model: str) -> None:
    """A built-in voice wins over a stored one of its name: refused, as the upload refuses it."""
    if any(v.casefold() == name.casefold() for v in family.voices(checkpoint)):
        raise CliError(f"name {name!r} is a built-in voice of {model}; choose another")


def write(store: VoiceStore, voice: StoredVoice, reference: bytes | None, extension: str,
          model: str, blob: bytes) -> StoredVoice:
    try:
        return store.add(voice, reference, extension, {model: blob})
    except VoiceError as exc:       # written meanwhile (a front's upload, another run)
        raise _fail(exc) from None
    except OSError as exc:
        raise CliError(f"voices directory {store.root}: {exc.strerror or exc}") from None


# --- precompute -----------------------------------------------------------------------------

def read_recording(path: Path) -> tuple[bytes, str, float]:
    """(bytes, extension, seconds) of a recording the upload route would take, else the
    message its 400 gives."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CliError(f"{path}: {exc.strerror or exc}") from None
    try:
        extension = audio_extension(None, path.name)
    except SpeechError:
        raise CliError(f"{path}: not a known audio file name; give one of "
                       f"{', '.join(sorted(EXTENSIONS))}") from None
    try:
        check_upload_size(data)
        seconds = check_recording(data)
    except SpeechError as exc:
        raise CliError(f"{path}: {exc.message}") from None
    return data, extension, seconds


def transcript(args) -> str | None:
    text = args.ref_text
    if args.ref_text_file is not None:
        try:
            text = args.ref_text_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError(f"{args.ref_text_file}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        return check_text_field(text, "ref_text", MAX_REF_TEXT_CHARS)
    except SpeechError as exc:
        raise _fail(exc) from None


def precompute(args) -> int:
    family = family_named(args.family, clones=True)
    model = model_of(family, args.model)
    try:
        consent = check_text_field(args.consent, "consent", MAX_CONSENT_CHARS, required=True)
        description = check_text_field(args.description, "speaker_description", MAX_DESCRIPTION_CHARS)
    except SpeechError as exc:
        raise _fail(exc) from None
    ref_text = transcript(args)
    store = writable_store(args.voices_dir)
    name = new_name(store, args.name)
    # What the recording is and how it is stored, checked before the checkpoint is read.
    audio, extension, seconds = read_recording(args.audio)
    try:
        mode, params = recording_params(family, audio, ref_text, args.mode)
    except SpeechError as exc:
        hint = "; give it with --ref-text or --ref-text-file" if exc.param == "ref_text" and not ref_text else ""
        raise CliError(exc.message + hint) from None
    open_checkpoint(family, args.checkpoint)
    not_builtin(name, family, args.checkpoint, model)
    blob = encode(voice_encoder(family, args.checkpoint, model, args.device), model, params)
    voice = StoredVoice(name=name, consent=consent, created=int(time.time()), ref_text=ref_text,
                        speaker_description=description, mime_type=f"audio/{extension}",
                        file_size=len(audio), duration=seconds, modes={model: mode.name})
    stored = write(store, voice, audio, extension, model, blob)
    print(f"{stored.name}: {model} features (mode {mode.name}) written to {stored.path}")
    return 0


# --- blend ----------------------------------------------------------------------------------

def parse_part(text: str) -> tuple[str, float]:
    name, sep, weight = text.rpartition(":")
    if not sep or not name.strip():
        raise CliError(f"{text!r} is not NAME:WEIGHT (a preset or stored voice, and its weight)")
    try:
        value = float(weight)
    except ValueError:
        raise CliError(f"the weight of {name!r} is {weight!r}, not a number") from None
    if not value > 0 or value == float("inf"):
        raise CliError(f"the weight of {name!r} is {weight}: weights must be positive finite "
                       "numbers (a blend is a weighted mean of its voices)")
    return name.strip(), value


def stored_vector(store: VoiceStore, voice: StoredVoice, family: Family, model: str):
    """(vector, fingerprint or None) of a stored voice for `model`: its features' vector, or
    the speaker_embedding it was uploaded with."""
    import numpy as np
    from safetensors.numpy import load

    blob = store.features(voice, model)
    if blob is not None:
        try:
            meta = voice_metadata(blob)
            arrays = load(blob)
        except Exception as exc:  # noqa: BLE001 - a damaged file is the operator's to replace
            raise CliError(f"voice {voice.name!r}: its {model} features cannot be read ({exc})") from None
        if meta.get("family") != family.name:
            raise CliError(f"voice {voice.name!r}: its {model} features are {meta.get('family')!r}'s, "
                           f"not {family.name}'s")
        feature = family.speaker_embeddings.feature
        if feature not in arrays:
            raise CliError(f"voice {voice.name!r}: its {model} features hold no speaker vector "
                           f"({feature!r})")
        return arrays[feature], meta.get("fingerprint")
    if voice.speaker_embedding is not None:
        return np.asarray(voice.speaker_embedding, np.float32), None
    raise CliError(f"voice {voice.name!r} has no features for {model} (it has: "
                   f"{', '.join(voice.models) or 'none'}) and no speaker_embedding: precompute it "
                   f"for {model} first (tritontts-voice precompute --model {model})")


def blend(args) -> int:
    family = family_named(args.family)
    if family.speaker_embeddings is None:
        speaking = sorted(f.name for f in FAMILIES.values() if f.speaker_embeddings)
        raise CliError(f"{family.name} does not speak from a speaker embedding, so its voices cannot "
                       f"be blended; families that do: {', '.join(speaking) or 'none'}")
    model = model_of(family, args.model)
    parts = [parse_part(p) for p in args.parts]
    seen: set[str] = set()
    for name, _ in parts:
        if name.casefold() in seen:
            raise CliError(f"{name!r} is named twice; give each voice once, with its whole weight")
        seen.add(name.casefold())
    try:
        consent = check_text_field(args.consent, "consent", MAX_CONSENT_CHARS)
        description = check_text_field(args.description, "speaker_description", MAX_DESCRIPTION_CHARS)
    except SpeechError as exc:
        raise _fail(exc) from None
    store = writable_store(args.voices_dir)
    name = new_name(store, args.name)
    open_checkpoint(family, args.checkpoint)
    not_builtin(name, family, args.checkpoint, model)
    try:
        presets = family.speaker_embeddings.presets(args.checkpoint)
    except CheckpointError as exc:
        raise CliError(f"{args.checkpoint} is not a {family.name} checkpoint: {exc}") from None
    by_key = {n.casefold(): (n, v) for n, v in presets.items()}
    vectors, fingerprints, recorded = [], {}, []
    for part, weight in parts:
        if part.casefold() in by_key:       # a preset, as a built-in voice wins over an upload
            spelled, vector = by_key[part.casefold()]
            kind = "preset"
        else:
            voice = store.get(part)
            if voice is None:
                raise CliError(f"{part!r} is neither a preset speaker of {args.checkpoint} "
                               f"({', '.join(sorted(presets)) or 'it has none'}) nor a voice in "
                               f"{store.root}")
            vector, fingerprint = stored_vector(store, voice, family, model)
            spelled, kind = voice.name, "voice"
            if fingerprint is not None:
                fingerprints[spelled] = fingerprint
        vectors.append(vector)
        recorded.append({"name": spelled, "kind": kind, "weight": weight})
    try:
        mixed = blend_embeddings(vectors, [w for _, w in parts])
    except ValueError as exc:
        raise CliError(str(exc)) from None
    total = sum(w for _, w in parts)
    for entry in recorded:
        entry["share"] = entry["weight"] / total
    stage = voice_encoder(family, args.checkpoint, model, args.device)
    own = stage.voice_fingerprint()
    for spelled, fingerprint in fingerprints.items():
        if fingerprint != own:
            raise CliError(f"voice {spelled!r}: its {model} features were computed by another checkpoint "
                           f"(fingerprint {fingerprint}; {args.checkpoint} is {own}): precompute it "
                           "again for this checkpoint")
    embedding = [float(v) for v in mixed]
    blob = encode(stage, model, embedding_params(embedding))
    summary = ", ".join(f"{e['name']} {e['share']:.3g}" for e in recorded)
    voice = StoredVoice(name=name, consent=consent or f"blend of {summary}", created=int(time.time()),
                        speaker_description=description or f"blend of {summary}", source="embedding",
                        speaker_embedding=embedding, modes={model: EMBEDDING_MODE}, blend=recorded)
    stored = write(store, voice, None, "bin", model, blob)
    print(f"{stored.name}: blend of {summary}; {model} features written to {stored.path}")
    return 0


# --- list, inspect, delete, modes -----------------------------------------------------------

def list_voices(args) -> int:
    store = readable_store(args.voices_dir)
    voices = store.list()
    families = {m: f.name for v in voices for m in v.models if (f := family_of(m)) is not None}
    if args.json:
        print(json.dumps([v.info(families) for v in voices], indent=1))
        return 0
    for v in voices:
        models = ", ".join(f"{m} ({mode_of(v, m, None) or '?'})" for m in v.models) or "no features"
        length = f"{v.duration:.1f} s" if v.duration is not None else v.source
        print(f"{v.name}\t{models}\t{length}\t{json.dumps(v.ref_text) if v.ref_text else '(no transcript)'}")
    return 0


def mode_of(voice: StoredVoice, model: str, meta: dict | None) -> str | None:
    """How a model's features were computed: as recorded, as their metadata says, else the
    rule an upload follows (Family.voice_mode)."""
    if model in voice.modes:
        return voice.modes[model]
    if meta and meta.get("mode"):
        return meta["mode"]
    if voice.source == "embedding":
        return EMBEDDING_MODE
    family = family_of(model)
    try:
        return family.voice_mode(bool(voice.ref_text)).name if family else None
    except ValueError:
        return None


def duration_of(store: VoiceStore, voice: StoredVoice) -> float | None:
    if voice.duration is not None:
        return voice.duration
    try:
        reference = store.reference(voice)
    except VoiceError:
        return None
    if reference is None:
        return None
    from tritontts.audio import decode_audio

    try:
        audio, rate = decode_audio(reference, "reference")
    except InvalidRequest:
        return None
    return audio.size / rate


def inspect(args) -> int:
    store = readable_store(args.voices_dir)
    voice = store.get(args.name)
    if voice is None:
        raise CliError(f"voice {args.name!r} is not in {store.root}")
    models = {}
    for model in voice.models:
        blob = store.features(voice, model)
        try:
            meta = voice_metadata(blob) if blob is not None else {}
        except InvalidRequest as exc:
            meta = {"error": str(exc)}
        models[model] = {"family": meta.get("family"), "fingerprint": meta.get("fingerprint"),
                         "mode": mode_of(voice, model, meta), "bytes": len(blob or b"")}
    report = {"name": voice.name, "folder": str(voice.path), "created": voice.created,
              "consent": voice.consent, "transcript": voice.ref_text,
              "duration": duration_of(store, voice), "source": voice.source,
              "reference_file": voice.reference_file, "speaker_description": voice.speaker_description,
              "blend": voice.blend, "models": models}
    mismatch = None
    if args.checkpoint is not None:
        if args.family is None:
            raise CliError("--checkpoint needs --family (whose checkpoint it is)")
        family = family_named(args.family, clones=True)
        open_checkpoint(family, args.checkpoint)
        mine = [m for m in models if family_of(m) is family]
        if not mine:
            raise CliError(f"voice {voice.name!r} has no {family.name} features (it has: "
                           f"{', '.join(models) or 'none'})")
        own = voice_encoder(family, args.checkpoint, family.name, args.device).voice_fingerprint()
        report["checkpoint"] = {"path": str(args.checkpoint), "fingerprint": own,
                                "matches": [m for m in mine if models[m]["fingerprint"] == own]}
        if not report["checkpoint"]["matches"]:
            theirs = ", ".join(f"{m}: {models[m]['fingerprint']}" for m in mine)
            mismatch = (f"voice {voice.name!r}: its {family.name} features were computed by another "
                        f"checkpoint ({theirs}; {args.checkpoint} is {own}): precompute it again "
                        "for this checkpoint")
    print(json.dumps(report, indent=1, ensure_ascii=False))
    if mismatch:
        raise CliError(mismatch)
    return 0


def delete(args) -> int:
    store = writable_store(args.voices_dir)
    try:
        voice = store.delete(args.name)
    except VoiceError as exc:
        raise _fail(exc) from None
    print(f"deleted {voice.name} ({voice.path})")
    return 0


def modes(args) -> int:
    families = [family_named(args.family)] if args.family else [
        f for f in FAMILIES.values() if f.voice_modes]
    for family in families:
        if not family.voice_modes:
            print(f"{family.name}: does not clone voices")
            continue
        blends = "; blends of speaker embeddings" if family.speaker_embeddings else ""
        print(f"{family.name}{blends}")
        for i, mode in enumerate(family.voice_modes):
            need = "needs a transcript" if mode.transcript else "no transcript"
            default = ", the default " + ("with" if mode.transcript else "without") + " one" \
                if family.voice_mode(mode.transcript) is mode else ""
            print(f"  {mode.name}\t({need}{default}) {mode.description}")
    return 0


# --- the command line -----------------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tritontts-voice", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Exit status 2: bad input (the message says what to fix).")
    sub = p.add_subparsers(dest="command", required=True)
    voices = argparse.ArgumentParser(add_help=False)
    voices.add_argument("--voices-dir", type=Path, default=default_voices_dir(),
                        help="the front's --voices-dir (default: $TRITONTTS_VOICES_DIR or "
                             "~/.local/share/tritontts/voices)")
    encoder = argparse.ArgumentParser(add_help=False)
    encoder.add_argument("--family", required=True, help="the family (tritontts-voice modes lists them)")
    encoder.add_argument("--checkpoint", type=Path, required=True, help="the checkpoint the server serves")
    encoder.add_argument("--model", help="the served model the features are for (default: the family's "
                                         "name; FAMILY-SUFFIX for another checkpoint served beside it)")
    encoder.add_argument("--device", default="cpu",
                         help="where the voice encoder runs (default cpu, as the stage's config; the "
                              "server's features equal these on the same device)")
    encoder.add_argument("--description", help="speaker_description, kept with the voice")

    s = sub.add_parser("precompute", parents=[voices, encoder],
                       help="a voice from a recording, through the family's own voice encoder")
    s.add_argument("--name", required=True, help="the voice's name (what requests put in `voice`)")
    s.add_argument("--audio", type=Path, required=True, help="the recording (1-30 s; wav, flac, mp3, ...)")
    s.add_argument("--consent", required=True, help="the speaker's consent record (as the upload's `consent`)")
    text = s.add_mutually_exclusive_group()
    text.add_argument("--ref-text", help="the transcript of the recording")
    text.add_argument("--ref-text-file", type=Path, help="a file holding the transcript")
    s.add_argument("--mode", help="how the voice is stored (tritontts-voice modes); default: the "
                                  "family's first that fits whether a transcript is given")
    s.set_defaults(run=precompute)

    s = sub.add_parser("blend", parents=[voices, encoder],
                       help="a voice from a weighted mean of presets' or stored voices' speaker embeddings")
    s.add_argument("--name", required=True, help="the new voice's name")
    s.add_argument("--consent", help="kept with the voice (default: the blend's parts)")
    s.add_argument("parts", nargs="+", metavar="NAME:WEIGHT",
                   help="a preset speaker of the checkpoint or a stored voice, and its weight (> 0)")
    s.set_defaults(run=blend)

    s = sub.add_parser("list", parents=[voices], help="the stored voices")
    s.add_argument("--json", action="store_true", help="the listing entries as JSON")
    s.set_defaults(run=list_voices)

    s = sub.add_parser("inspect", parents=[voices], help="one voice: its models, modes, fingerprints")
    s.add_argument("name")
    s.add_argument("--family", help="with --checkpoint: check the voice's features are that checkpoint's")
    s.add_argument("--checkpoint", type=Path)
    s.add_argument("--device", default="cpu")
    s.set_defaults(run=inspect)

    s = sub.add_parser("delete", parents=[voices], help="remove a voice")
    s.add_argument("name")
    s.set_defaults(run=delete)

    s = sub.add_parser("modes", help="each cloning family's voice modes")
    s.add_argument("--family")
    s.set_defaults(run=modes)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except CliError as exc:
        print(f"tritontts-voice: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
