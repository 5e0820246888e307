"""The Family descriptor: everything that differs between TTS families, in one place.

The launcher, the HTTP front, the ensemble generator and the tests loop over the registered
descriptors (`tritontts.families.FAMILIES`) and read capabilities from them; none of them
branches on a family's name. Each family declares its descriptor in its own
`tritontts/families/<family>/family.py`, which must stay light to import (no torch, no
Triton): the front imports it. Its heavy code (checkpoint reader, random checkpoint writer,
graph exporter) it names with `lazy`, imported on first call.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from .weights.checkpoint import CheckpointError
from .protocol import RequestFields


class Lazy:
    """The function named "module:function", imported on its first call; a relative module
    is in `package` (a descriptor passes its __package__)."""

    def __init__(self, package: str, spec: str):
        module, sep, self.name = spec.partition(":")
        if not sep or not module or not self.name:
            raise ValueError(f"a lazy function is 'module:function', got {spec!r}")
        self.module = importlib.util.resolve_name(module, package)
        self._function: Callable | None = None

    def resolve(self) -> Callable:
        if self._function is None:
            self._function = getattr(importlib.import_module(self.module), self.name)
        return self._function

    def __call__(self, *args, **kwargs):
        return self.resolve()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"lazy({self.module}:{self.name})"


def lazy(package: str, spec: str) -> Lazy:
    return Lazy(package, spec)


# Stand-ins in a DocumentedRequest's body, filled in where it is replayed.
REF_AUDIO, REF_TEXT = "$REF_AUDIO", "$REF_TEXT"   # a reference recording (a data: URL), its transcript
CHECKPOINT_PATH = "$CHECKPOINT"                   # the served checkpoint's path (vllm serve PATH)
RELEASED_NAME = "$RELEASED"                       # the family's first released name, else its own


@dataclass(frozen=True)
class DocumentedRequest:
    """A request vLLM-Omni's TTS docs show for a family (its online-serving README: curl,
    httpx, the OpenAI SDK, its CLI clients' flags as the requests they send), and the outcome
    they document. The contract suite replays each one unchanged but for the stand-ins above
    and the family's frame or step budget (tiny random talkers rarely end by themselves)."""
    source: str                     # where the docs show it
    body: dict[str, Any]
    client: str = "http"            # http (curl, httpx), openai (the SDK), stream (raw PCM)
    status: int = 200
    says: str = ""                  # for a 4xx: a phrase of its message
    variant: str | None = None      # the checkpoint variant it needs (None: the default)


def quick_start(status: int = 200, says: str = "") -> tuple[DocumentedRequest, ...]:
    """vLLM-Omni's Common Quick Start, the same for every family, and `model` as the path
    the server was started with."""
    hello = {"input": "Hello, how are you?", "voice": "default"}
    return (
        DocumentedRequest("quick start: curl / httpx", {**hello, "response_format": "wav"}, status=status, says=says),
        DocumentedRequest("quick start: OpenAI SDK", {**hello, "model": RELEASED_NAME}, "openai", status, says),
        DocumentedRequest("quick start: streaming PCM", {**hello, "stream": True, "stream_format": "audio",
                                                         "response_format": "pcm"}, "stream", status, says),
        DocumentedRequest("vllm serve <local path>: model is that path", {**hello, "model": CHECKPOINT_PATH},
                          status=status, says=says),
    )


@dataclass(frozen=True)
class Layout:
    """How a family's checkpoint folder is told from its files alone (`tritontts serve MODEL`
    names no family): every path of `files` present (a glob pattern matches any file), and
    each key of config.json's `config` among its values. Two families' layouts never both
    match one folder: detect refuses a folder two match, and tests/launch/test_serve.py
    detects every family's checkpoint."""
    files: tuple[str, ...] = ()
    config: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)

    def matches(self, root: Path) -> bool:
        if not root.is_dir() or not all(next(root.glob(pattern), None) is not None for pattern in self.files):
            return False
        if not self.config:
            return True
        config = config_json(root)
        return all(config.get(key) in values for key, values in self.config.items())

    def describe(self) -> str:
        said = [f"config.json {key} {' or '.join(map(str, values))}" for key, values in self.config.items()]
        return ", ".join(said + list(self.files))


def config_json(root: Path) -> dict[str, Any]:
    """The folder's config.json as a dict ({} when it has none or it is not a JSON object)."""
    from .weights.checkpoint import read_json

    try:
        value = read_json(root / "config.json")
    except CheckpointError:
        return {}
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class Variant:
    """Another checkpoint of a family that the contract suite also runs: the options its
    random checkpoint is written with, and the request fields a request to it needs."""
    options: dict[str, Any]
    example_params: Callable[[], dict[str, Any]]


@dataclass(frozen=True)
class Capabilities:
    """What a family can honour; the front answers 400 for what it cannot."""
    sample_rate: int                      # of every chunk it streams
    native_speed: bool = False            # `speed` changes the synthesis itself
    reference_audio: bool = False         # clones a voice from ref_audio (+ ref_text)
    instructions: bool = False            # honours style `instructions`
    preset_voices: bool = False           # has named voices of its own (a speaker table)
    streaming: bool = True                # audio leaves in chunks while synthesis goes on
    # `input` may be empty when `instructions` carry the whole request (AuK: an edit of a clip,
    # a sound); the front then skips its empty-input 400 and the family's stage decides.
    instruction_only: bool = False
    max_instructions_chars: int = 500     # vLLM-Omni's limit for TTS instructions


@dataclass(frozen=True)
class BatchCase:
    """A stage whose network computes Triton's batches together, and the requests it is
    measured on (tritontts.benchmark.batching, scripts/gpu_check.py)."""
    stage: str                          # its model's name (model_repository/<stage>)
    load: Callable[[Any], Any]          # StageContext -> the stage on the opened checkpoint
    request: Callable[[int], Any]       # k -> the k-th request's Inputs, all of one batch_key
    audio_seconds: float                # the audio one request makes
    shape: str                          # what a request is, in words


@dataclass(frozen=True)
class VoiceMode:
    """A way the family's voice encoder stores a voice from a recording: what
    `tritontts-voice precompute --mode NAME` computes, and what an upload computes (the
    family's first mode that fits whether the upload has a transcript)."""
    name: str                       # e.g. vLLM-Omni's precompute_custom_voice.py mode names
    description: str
    transcript: bool                # True: needs ref_text; False: takes none
    # Request fields beside ref_audio (and ref_text) that select this mode in the encoder's
    # request, e.g. {"x_vector_only_mode": True}; they must be fields the family takes.
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SpeakerEmbeddings:
    """A family that speaks from a speaker embedding (one vector its prompt takes as the
    voice): `tritontts-voice blend` makes a voice of a weighted mean of such vectors, from
    the checkpoint's preset speakers or from stored voices, and stores it as a voice uploaded
    with `speaker_embedding` would be."""
    # checkpoint path -> {preset speaker name: its vector (float32)}; {} when it has none.
    presets: Callable[[Path], dict[str, Any]]
    # The array of the family's packed voice features that holds a stored voice's vector.
    feature: str = "embedding"


@dataclass(frozen=True)
class Form:
    """What one served checkpoint asks of a request beyond its family's fields (Family.fields):
    for a client that builds a form from it (the front's GET /v1/audio/models, the demo page).
    The stages still check every request; a form only spares the user a 400."""
    choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # field -> the values it takes
    required: tuple[str, ...] = ()        # fields every request to it needs
    reference_required: bool = False      # every request needs ref_audio or an uploaded voice
    hidden: tuple[str, ...] = ()          # fields the family takes that this checkpoint refuses


@dataclass(frozen=True)
class Family:
    name: str                             # OpenAI `model` value and the ensemble's name
    description: str
    stages: tuple[str, ...]               # stage models in pipeline order (ensembles/ is
                                          # generated from them: tritontts.deploy.repository)
    parse_params: Callable[[dict[str, Any]], Any]   # the family's one parameter parser
    capabilities: Capabilities
    # The checkpoint: `--checkpoint NAME=PATH` or the environment variable below.
    checkpoint_help: str
    fields: RequestFields = field(default_factory=lambda: RequestFields({}))  # its request.py's FIELDS
    checkpoint_required: bool = True
    checkpoint_env_name: str | None = None          # default TRITONTTS_<NAME>_CHECKPOINT
    # Reads the checkpoint at a path, raising CheckpointError naming what is wrong: the
    # launcher opens it before starting anything; the stages open it the same way.
    open_checkpoint: Callable[[Path], Any] | None = None
    voices: Callable[[Path | None], list[str]] = field(default=lambda checkpoint: ["default"])
    # What a checkpoint's requests need and may choose (a form's fields); None: the
    # launcher does not know the checkpoint (a front given --triton-url only).
    form: Callable[[Path | None], Form] = field(default=lambda checkpoint: Form())
    # The stage that turns a reference recording into stored voice features (its
    # `voice_features` output, tritontts/voice.py); None: no uploaded voices.
    voice_encoder: str | None = None
    # How its voice encoder stores a voice from a recording (at least one when it has a
    # voice_encoder); the first that fits is an upload's (see voice_mode).
    voice_modes: tuple[VoiceMode, ...] = ()
    # Set where the family speaks from a speaker embedding (blended voices).
    speaker_embeddings: SpeakerEmbeddings | None = None
    # Released checkpoint names a request's `model` may use for this family
    # (e.g. FunAudioLLM/Fun-CosyVoice3-0.5B-2512).
    released_names: tuple[str, ...] = ()
    # How its released checkpoint folder is recognised (None: it has none to serve from a
    # path), and what kind of it an opened checkpoint is, in words ("Base", "AuK-Flash"):
    # what `tritontts serve MODEL` detects and reports.
    layout: Layout | None = None
    variant_of: Callable[[Any], str] | None = None
    # The stage settings (stage -> {key: value}) that make it synthesize each utterance whole,
    # not in streamed chunks: what vLLM-Omni's --no-async-chunk means for it. Empty: it has
    # no such mode here, and `tritontts serve --no-async-chunk` says so.
    whole_utterance: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # For tests and benchmarks: a random checkpoint in the real layout, and the extra
    # request fields (beyond input/voice) that a request to it needs.
    write_random_checkpoint: Callable[..., Path] | None = None
    # The networks of its non-autoregressive stages that may run on onnxruntime or TensorRT
    # (tritontts.nn.runtime Graphs) of an opened checkpoint: what build/export.py exports.
    graphs: Callable[[Any], list] | None = None
    # Its stages whose network computes Triton's batches together (GroupedStage), each with
    # a request at streaming shapes, of an opened checkpoint (tritontts.benchmark.batching).
    batch_cases: Callable[[Any], list] | None = None
    # Every network its stages run in PyTorch (the `graphs` among them, the per-frame
    # sub-models, the backbone where our stages hold one), as tritontts.nn.runtime Graphs
    # with random weights built on torch's default device at a size: "tiny" (the random
    # checkpoints' sizes) or "released" (None there: a network only vLLM runs at that
    # size). Each axis' opt is a streaming request's shape and the first input's first
    # axis is the batch: the GPU check's PyTorch tier (tritontts.benchmark.gpu_torch).
    torch_networks: Callable[[str], list] | None = None
    example_params: Callable[[], dict[str, Any]] = field(default=dict)
    # Checkpoint variants the contract suite also runs (e.g. Qwen3-TTS's kinds), by name.
    variants: dict[str, Variant] = field(default_factory=dict)
    # vLLM-Omni's documented requests for the family and their outcomes (tests/contract replays them).
    documented_requests: tuple[DocumentedRequest, ...] = ()

    @property
    def checkpoint_env(self) -> str:
        return self.checkpoint_env_name or f"TRITONTTS_{self.name.upper()}_CHECKPOINT"

    def checkpoint(self, environ: dict[str, str] | None = None) -> Path | None:
        """The checkpoint path the launcher handed the stages (None: the family's default)."""
        value = (os.environ if environ is None else environ).get(self.checkpoint_env)
        if value:
            return Path(value)
        if self.checkpoint_required:
            raise CheckpointError(f"{self.checkpoint_env} is not set: start with "
                                  f"`python -m frontend --families {self.name} "
                                  f"--checkpoint {self.name}=PATH` ({self.checkpoint_help})")
        return None

    def voice_mode(self, transcript: bool, name: str | None = None) -> VoiceMode:
        """The mode a voice is stored in from a recording with (or without) a transcript:
        `name`, else the first of voice_modes that fits. ValueError saying what to change
        (the front answers it as a 400, tritontts-voice exits 2 with it)."""
        if not self.voice_modes:
            raise ValueError(f"{self.name} does not clone voices")
        modes = ", ".join(f"{m.name} ({'needs a transcript' if m.transcript else 'no transcript'})"
                          for m in self.voice_modes)
        if name is not None:
            mode = next((m for m in self.voice_modes if m.name == name), None)
            if mode is None:
                raise ValueError(f"{self.name} has no voice mode {name!r}; its modes: {modes}")
            if mode.transcript and not transcript:
                raise ValueError(f"voice mode {name} needs a transcript of the recording (ref_text)")
            if transcript and not mode.transcript:
                raise ValueError(f"voice mode {name} takes no transcript; omit ref_text, or choose "
                                 f"a mode that uses it ({modes})")
            return mode
        mode = next((m for m in self.voice_modes if m.transcript == transcript), None)
        if mode is not None:
            return mode
        if not transcript:
            raise ValueError(f"a transcript of the recording is required (ref_text): {self.name} "
                             "clones a voice from a recording and what it says")
        raise ValueError(f"{self.name} takes no transcript of the recording; omit ref_text")

    def export_graphs(self, path: Path) -> list:
        """The `graphs` of the checkpoint at `path`."""
        if self.graphs is None or self.open_checkpoint is None:
            raise ValueError(f"{self.name} has no networks to export")
        return self.graphs(self.open_checkpoint(path))

    def request_params(self, speed: float, extra: dict[str, Any]) -> dict[str, Any]:
        """The ensemble's `params` for an HTTP request: its extra fields plus `speed` when it
        is not 1 and the family has duration control (else the front time-stretches the
        audio), checked by the family's parser (a 400 before Triton is asked)."""
        params = dict(extra)
        if speed != 1.0 and self.capabilities.native_speed:
            params["speed"] = speed
        self.parse_params(params)
        return params


def synthetic_reference() -> dict:
    """Request fields for cloning in tests and benchmarks: a 3 s synthetic reference
    recording (a 150 Hz tone, amplitude-modulated like syllables) and its transcript."""
    import base64
    import io

    import numpy as np
    import soundfile as sf

    t = np.arange(3 * 24000) / 24000
    audio = (0.3 * np.sin(2 * np.pi * 150 * t) * (1 + np.sin(2 * np.pi * 2 * t))).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, audio, 24000, format="WAV")
    return {"ref_audio": base64.b64encode(buf.getvalue()).decode(),
            "ref_text": "This is the reference voice."}
