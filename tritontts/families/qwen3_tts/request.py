"""Per-request parameters of the Qwen3-TTS family: the one place that validates them.

The fields are vLLM-Omni's speech-request fields for Qwen3-TTS (`voice` is the ensemble's
voice input, handled by the stage: the CustomVoice speaker, any case):

  task_type                  CustomVoice | VoiceDesign | Base; absent: Base when a voice
                             reference (ref_audio, ref_text, speaker_embedding) is given,
                             else the loaded checkpoint's own task
  instructions               style / emotion (CustomVoice), the voice description (VoiceDesign)
  language                   a checkpoint language or "Auto" (any case; checked against the
                             checkpoint by check_task)
  ref_audio, ref_text        Base: reference audio (base64 or a data: URL) and its transcript
  x_vector_only_mode         Base: clone from the speaker embedding alone (no transcript)
  speaker_embedding          Base: a precomputed x-vector (finite floats) instead of ref_audio
  max_new_tokens             1..8192 codec frames
  seed
  initial_codec_chunk_frames 1..25: frames in the first audio chunk
  non_streaming_mode         true: the whole text in the prefill (the reference wrapper's
                             CustomVoice/VoiceDesign default); absent/false: text fed step by
                             step (the reference generate()'s default)
  temperature, top_k, top_p, repetition_penalty, subtalker_temperature, subtalker_top_k,
  subtalker_top_p            sampling overrides (over generation_config.json), e.g. in
                             extra_params; tritontts.sampling checks them
  voice_features             a stored voice's features (tritontts.voice; the front sends
                             them for a voice uploaded with POST /v1/audio/voices or written
                             by tritontts-voice): on Base they clone as they were stored (icl,
                             xvec, or an embedding); on CustomVoice a voice stored from a
                             speaker embedding (e.g. a blend of presets) is the speaker row in
                             place of a preset's. Absent task_type: the checkpoint's task

parse_qwen3_tts_params checks what needs no checkpoint (the front calls it too);
check_task checks the request against the loaded checkpoint (kind, languages, sizes).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

from ...sampling import sampling_overrides
from ...protocol import InvalidRequest, RequestFields, audio_param, int_param, seed_param
from ...voice import VOICE_FEATURES, voice_features_param
from .checkpoint import AUTO_LANGUAGE, KIND_OF_TASK, TASK_OF_KIND

SAMPLING_KNOBS = ("temperature", "top_k", "top_p", "repetition_penalty", "subtalker_temperature",
                  "subtalker_top_k", "subtalker_top_p")
FIELDS = RequestFields(
    takes={
        "task_type": "CustomVoice | VoiceDesign | Base; absent: Base when a voice reference is "
                     "given, else the checkpoint's own task",
        "instructions": "style / emotion (CustomVoice), the voice description (VoiceDesign)",
        "language": 'a checkpoint language or "Auto"',
        "ref_audio": "Base: reference audio (base64 or a data: URL)",
        "ref_text": "Base: its transcript",
        "x_vector_only_mode": "Base: clone from the speaker embedding alone (no transcript)",
        "speaker_embedding": "Base: a precomputed x-vector instead of ref_audio",
        "max_new_tokens": "1..8192 codec frames",
        "seed": "every draw of the request",
        "initial_codec_chunk_frames": "1..25: frames in the first audio chunk",
        "non_streaming_mode": "true: the whole text in the prefill; false: text fed step by step",
        VOICE_FEATURES:
            "Base or CustomVoice: a stored voice (tritontts.voice), sent by the front for an uploaded one "
            "(CustomVoice: one stored from a speaker embedding, e.g. a blend of presets)",
        "temperature": "sampling override (over generation_config.json)",
        "top_k": "sampling override (over generation_config.json)",
        "top_p": "sampling override (over generation_config.json)",
        "repetition_penalty": "sampling override (over generation_config.json)",
        "subtalker_temperature": "sampling override (over generation_config.json)",
        "subtalker_top_k": "sampling override (over generation_config.json)",
        "subtalker_top_p": "sampling override (over generation_config.json)",
    },
)
TASKS = tuple(KIND_OF_TASK)
MAX_INSTRUCTIONS_CHARS = 4096
MAX_TEXT_FIELD_CHARS = 4096
# generation_config.json's max_new_tokens of the released checkpoints.
MAX_NEW_TOKENS = 8192
# The codec stage decodes 25-frame chunks (2 s); a first chunk can only be shorter.
MAX_INITIAL_CHUNK_FRAMES = 25
# Longer than any x-vector a released checkpoint takes (1024 / 2048); the exact size is
# the checkpoint's and check_task compares against it.
MAX_SPEAKER_EMBEDDING = 8192
# Released checkpoint names, for messages that say which checkpoint a task needs.
CHECKPOINT_NAMES = {"custom_voice": "Qwen3-TTS-12Hz-{0.6B,1.7B}-CustomVoice",
                    "voice_design": "Qwen3-TTS-12Hz-1.7B-VoiceDesign",
                    "base": "Qwen3-TTS-12Hz-{0.6B,1.7B}-Base"}


@dataclass(frozen=True)
class Qwen3TTSParams:
    task_type: str | None               # None: the checkpoint's task (check_task resolves it)
    instructions: str | None
    language: str                       # "Auto" unless given
    ref_audio: bytes | None
    ref_text: str | None
    x_vector_only_mode: bool
    speaker_embedding: tuple[float, ...] | None
    max_new_tokens: int | None
    seed: int | None
    initial_codec_chunk_frames: int | None
    voice_features: bytes | None = None
    non_streaming_mode: bool = False
    sampling: dict = field(default_factory=dict)   # checked overrides (tritontts.sampling)

    @property
    def in_context(self) -> bool:
        """Base cloning prompted with the reference's codes and transcript (ICL)."""
        return not self.x_vector_only_mode


def _text(params: dict[str, Any], name: str, limit: int) -> str | None:
    value = params.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequest(f"{name} must be a string")
    value = value.strip()
    if len(value) > limit:
        raise InvalidRequest(f"{name} is {len(value)} characters; the limit is {limit}")
    return value or None


def _embedding(value: Any) -> tuple[float, ...] | None:
    if value is None:
        return None
    if (not isinstance(value, list) or not value or len(value) > MAX_SPEAKER_EMBEDDING
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
        raise InvalidRequest(f"speaker_embedding must be a non-empty list of at most "
                             f"{MAX_SPEAKER_EMBEDDING} numbers")
    if not all(math.isfinite(v) for v in value):
        raise InvalidRequest("speaker_embedding values must be finite (no NaN or Inf)")
    return tuple(float(v) for v in value)


def parse_qwen3_tts_params(params: dict[str, Any]) -> Qwen3TTSParams:
    FIELDS.check(params, "qwen3_tts")
    task = params.get("task_type")
    if task is not None and task not in TASKS:
        raise InvalidRequest(f"task_type must be one of {list(TASKS)}, got {task!r}")
    instructions = _text(params, "instructions", MAX_INSTRUCTIONS_CHARS)
    language = _text(params, "language", 64) or "Auto"
    ref_text = _text(params, "ref_text", MAX_TEXT_FIELD_CHARS)
    ref_audio = audio_param(params["ref_audio"]) if params.get("ref_audio") is not None else None
    embedding = _embedding(params.get("speaker_embedding"))
    x_vector_only = params.get("x_vector_only_mode")
    if x_vector_only is not None and not isinstance(x_vector_only, bool):
        raise InvalidRequest("x_vector_only_mode must be true or false")
    non_streaming = params.get("non_streaming_mode")
    if non_streaming is not None and not isinstance(non_streaming, bool):
        raise InvalidRequest("non_streaming_mode must be true or false")

    features = (voice_features_param(params[VOICE_FEATURES])
                if params.get(VOICE_FEATURES) is not None else None)
    if features is not None and (ref_audio is not None or ref_text is not None or embedding is not None):
        raise InvalidRequest("a stored voice (voice_features) replaces ref_audio, ref_text and "
                             "speaker_embedding; send one or the other")
    cloning = ref_audio is not None or ref_text is not None or embedding is not None
    if task is None and cloning:
        task = "Base"           # as vLLM-Omni infers it from a voice reference
    # A stored voice alone leaves the task to the checkpoint (check_task): Base clones it,
    # CustomVoice speaks one stored from a speaker embedding.
    if task is not None and task != "Base":
        for name in ("ref_audio", "ref_text", "x_vector_only_mode", "speaker_embedding"):
            if params.get(name) is not None:
                raise InvalidRequest(f"{name} is only valid for task_type Base (voice cloning)")
        if features is not None and task != "CustomVoice":
            raise InvalidRequest(f"{VOICE_FEATURES} (a stored voice) are for task_type Base or CustomVoice")
    if task == "VoiceDesign" and instructions is None:
        raise InvalidRequest("VoiceDesign needs instructions: a description of the voice to create")
    if task == "Base":
        if instructions is not None:
            # The reference's voice clone never prompts with an instruction.
            raise InvalidRequest("instructions are not used by Base voice cloning; omit them")
        if features is not None:
            pass    # the stored features say whether they clone in context
        elif embedding is not None:
            if ref_audio is not None:
                raise InvalidRequest("speaker_embedding and ref_audio are mutually exclusive")
            if x_vector_only is False:
                raise InvalidRequest("speaker_embedding clones from the embedding alone; "
                                     "omit x_vector_only_mode or set it true")
            x_vector_only = True
        elif ref_audio is None:
            raise InvalidRequest("Base clones a voice: give ref_audio (base64 audio) or speaker_embedding")
        elif not x_vector_only and ref_text is None:
            raise InvalidRequest("Base in-context cloning needs ref_text (the transcript of ref_audio); "
                                 "or set x_vector_only_mode true to clone from the speaker embedding only")
    return Qwen3TTSParams(
        task_type=task, instructions=instructions, language=language, ref_audio=ref_audio,
        ref_text=ref_text, x_vector_only_mode=bool(x_vector_only), speaker_embedding=embedding,
        max_new_tokens=int_param(params, "max_new_tokens", 1, MAX_NEW_TOKENS), seed=seed_param(params),
        initial_codec_chunk_frames=int_param(params, "initial_codec_chunk_frames", 1, MAX_INITIAL_CHUNK_FRAMES),
        voice_features=features, non_streaming_mode=bool(non_streaming),
        sampling=sampling_overrides(params, SAMPLING_KNOBS))


def check_task(params: Qwen3TTSParams, kind: str, *, languages: Iterable[str] | None = None,
               speaker_embedding_dim: int | None = None, model_size: str | None = None) -> str:
    """The task the request runs on a checkpoint of `kind` (custom_voice | voice_design |
    base), or a 400 naming the checkpoint kind it needs. With the checkpoint's `languages`
    (Qwen3TTSCheckpoint.languages), x-vector size and tts_model_size, checks those too."""
    own = TASK_OF_KIND[kind]
    task = params.task_type or own
    if task != own:
        needed = KIND_OF_TASK[task]
        raise InvalidRequest(
            f"task_type {task} needs a {needed} checkpoint ({CHECKPOINT_NAMES[needed]}); "
            f"the loaded checkpoint is {kind} (task_type {own})")
    if params.voice_features is not None and task not in ("Base", "CustomVoice"):
        raise InvalidRequest(f"a stored voice needs a base or custom_voice checkpoint ({CHECKPOINT_NAMES['base']} "
                             f"or {CHECKPOINT_NAMES['custom_voice']}); the loaded checkpoint is {kind}")
    if task != "Base" and params.x_vector_only_mode:
        raise InvalidRequest("x_vector_only_mode is only valid for task_type Base (voice cloning)")
    if task == "Base" and params.instructions is not None:
        raise InvalidRequest("instructions are not used by Base voice cloning; omit them")
    if task == "VoiceDesign" and params.instructions is None:
        raise InvalidRequest("VoiceDesign needs instructions: a description of the voice to create")
    if task == "CustomVoice" and params.instructions is not None and model_size == "0b6":
        # The reference drops instructions for the 0.6B CustomVoice ("instruct is not supported").
        raise InvalidRequest("the 0.6B CustomVoice checkpoint does not follow instructions; "
                             "omit them or load Qwen3-TTS-12Hz-1.7B-CustomVoice")
    if languages is not None:
        allowed = {name.lower() for name in languages} | {AUTO_LANGUAGE}
        if params.language.lower() not in allowed:
            raise InvalidRequest(f"language {params.language!r} is not one of this checkpoint's: "
                                 f"{sorted(n.capitalize() for n in allowed)}")
    if (speaker_embedding_dim is not None and params.speaker_embedding is not None
            and len(params.speaker_embedding) != speaker_embedding_dim):
        raise InvalidRequest(f"speaker_embedding has {len(params.speaker_embedding)} values; "
                             f"this checkpoint takes {speaker_embedding_dim}")
    return task
