"""The OmniVoice stages (each a tritontts.serving.stage class named by its config.pbtxt):

  omnivoice_prompt     OmniVoicePromptStage     text, voice, params -> one generator input
                                                per text segment (a sentence or a few short
                                                ones); the reference's codes encoded (cached)
  omnivoice_generator  OmniVoiceGeneratorStage  a segment's sequence -> its codes [T, 8]: the
                                                unmasking loop, Triton's batches run together
                                                (grouped by step count)
  omnivoice_decoder    OmniVoiceDecoderStage    codes -> 24 kHz audio (the higgs-audio v2
                                                codec decoder; Triton's batches decoded
                                                together, grouped by length), volume, fades
                                                and padding

Long input streams segment by segment: the first segment's audio plays while the next are
generated. Without a reference voice, every later segment clones the first segment's voice
(its codes and text become their reference, as the reference's own long-text path does):
the prompt stage lays out that reference's place (its length is the first segment's
estimated length), the generator fills it with the first segment's codes, kept per stream.
"""
from __future__ import annotations

import hashlib
import threading
from typing import Any

import numpy as np
import torch

from ...audio import reference_recording
from ...serving.lru import LRU
from ...protocol import (
    AUDIO, CHUNK_INDEX, IS_FINAL, PARAMS, SAMPLE_RATE, STREAM_ID, InvalidRequest, decode_params)
from ...serving.stage import (
    PREPARES_REQUESTS,
    GroupedStage, Inputs, Stage, StageContext, StreamingStage, begin_request, default_voice_only,
    one_row_per_stream)
from ...text import normalize, split_sentences
from ...voice import checkpoint_fingerprint, pack_voice, unpack_voice
from .checkpoint import OmniVoiceCheckpoint
from .family import FAMILY
from .duration import estimate_frames
from .prompt import TextTokenizer, build_sequence
from .request import OmniVoiceParams, parse_omnivoice_params
from .text import add_punctuation, resolve_instructions

SAMPLE_RATE_HZ = 24000
MIN_REF_SECONDS, MAX_REF_SECONDS = 1.0, 30.0
# Sentences shorter than this many characters join the next one: a lone "Yes." has too
# little text for a natural duration and prosody.
MIN_SEGMENT_CHARS = 40
# The reference's output shaping: references quieter than this RMS are raised to it for
# encoding and the output is brought back down; without a reference the peak is set to 0.5.
REFERENCE_RMS, PEAK = 0.1, 0.5
FADE_SECONDS = PAD_SECONDS = 0.1


def export_graphs(checkpoint: OmniVoiceCheckpoint) -> list:
    """The generator's logits and the codec decoder: the networks that may run on
    onnxruntime or TensorRT."""
    from ...nn.higgs_codec import decoder_graph, load_codec_decoder
    from .generator import load_generator, logits_graph

    return [logits_graph(load_generator(checkpoint)), decoder_graph(load_codec_decoder(checkpoint.codec_dir))]


def segments(text: str) -> list[str]:
    """The text in streaming units: sentences, short ones joined to the next."""
    parts: list[str] = []
    for sentence in split_sentences(normalize(text)):
        if parts and len(parts[-1]) < MIN_SEGMENT_CHARS:
            parts[-1] = f"{parts[-1]} {sentence}"
        else:
            parts.append(sentence)
    if len(parts) > 1 and len(parts[-1]) < MIN_SEGMENT_CHARS // 2:
        parts[-2:] = [f"{parts[-2]} {parts[-1]}"]
    return parts


class OmniVoicePromptStage(StreamingStage):
    one_by_one = PREPARES_REQUESTS

    uses_torch = True

    def __init__(self, context: StageContext, checkpoint: OmniVoiceCheckpoint | None = None):
        super().__init__(context)
        self.checkpoint = checkpoint or context.open_checkpoint(FAMILY)
        self.tokenizer = TextTokenizer(self.checkpoint.root)
        self._encoder = None
        self._encoder_lock = threading.Lock()
        self.references = LRU(64)
        root = self.checkpoint.root
        self.fingerprint = checkpoint_fingerprint(root, [
            name for name in ("audio_tokenizer", "tokenizer.json", "vocab.json", "merges.txt",
                              "tokenizer_config.json") if (root / name).exists()])
        self.voice_spec = {"codes": (np.int64, (self.checkpoint.config.num_audio_codebook, None)),
                           "rms": (np.float32, (1,))}

    @property
    def encoder(self):
        """The codec's encoder, loaded on the first cloning request (it carries a HuBERT)."""
        with self._encoder_lock:
            if self._encoder is None:
                from ...nn.higgs_codec import HiggsCodecEncoder

                self._encoder = HiggsCodecEncoder(self.checkpoint.codec_dir)
            return self._encoder

    def run(self, inputs: Inputs):
        start = begin_request(inputs, parse_omnivoice_params)
        default_voice_only(start.voice, "OmniVoice has no preset speakers; "
                           "use voice 'default', describe one in instructions, send "
                           "ref_audio + ref_text, or upload a voice")
        for item in self.plan(start.text, start.params, start.seed):
            yield {**item, STREAM_ID: start.stream_id}

    def plan(self, text: str, params: OmniVoiceParams, seed: int) -> list[dict[str, Any]]:
        """The generator inputs of each segment (Triton-free: tests call it directly)."""
        cfg = self.checkpoint.config
        parts = segments(text)
        if not parts:
            raise InvalidRequest("input has nothing to speak")
        instructions = resolve_instructions(params.instructions, text)
        ref_codes, ref_text, rms = self.reference(params)
        items = []
        first = None
        first_frames_1 = estimate_frames(parts[0], None, None)      # the first segment at speed 1
        for index, part in enumerate(parts):
            from_first = ref_codes is None and index > 0
            if from_first:   # the first segment's codes go here (the generator fills them in)
                placeholder = np.full((cfg.num_audio_codebook, first.frames), cfg.audio_mask_id, np.int64)
                # paced like the first segment at speed 1, then divided by the speed (paced
                # like the sped-up segment itself, the speed compounded: speed 0.5 gave the
                # second segment four times its length; estimate_frames is not linear)
                frames = max(1, int(estimate_frames(part, parts[0], first_frames_1) / params.speed))
                seq = build_sequence(self.tokenizer, cfg.num_audio_codebook, cfg.audio_mask_id, part,
                                     params.language, instructions, parts[0], placeholder, frames=frames)
            else:
                seq = build_sequence(self.tokenizer, cfg.num_audio_codebook, cfg.audio_mask_id, part,
                                     params.language, instructions, ref_text, ref_codes, params.speed)
            first = first or seq
            items.append({
                "ids": seq.ids.T.astype(np.int32), "audio_start": seq.audio_start,
                "frames": seq.frames, "from_first": from_first, "num_steps": params.num_steps,
                "guidance_scale": params.guidance_scale, "seed": (seed + index) % 2**63,
                "ref_rms": rms, "speed": params.speed, IS_FINAL: index == len(parts) - 1})
        return items

    def reference(self, params: OmniVoiceParams) -> tuple[np.ndarray | None, str | None, float]:
        """(codes [C, R], transcript, the recording's RMS) of the voice to clone; (None, None,
        0.0) without one."""
        if params.voice_features is not None:
            arrays, meta = unpack_voice(params.voice_features, FAMILY.name, self.fingerprint,
                                        self.voice_spec)
            return arrays["codes"], meta.get("ref_text") or None, float(arrays["rms"][0])
        if params.ref_audio is None:
            return None, None, 0.0
        audio = self.reference_audio(params.ref_audio)
        # float32, as a stored voice keeps it: the same voice gives the same audio either way.
        rms = float(np.float32(np.sqrt(np.mean(audio.astype(np.float64) ** 2))))
        if 0 < rms < REFERENCE_RMS:
            audio = audio * (REFERENCE_RMS / rms)
        key = hashlib.sha256(audio.tobytes()).hexdigest()
        codes = self.references.get(key, lambda: self.encoder.encode(audio.astype(np.float32)))
        return codes, add_punctuation(params.ref_text), rms

    def voice_fingerprint(self) -> str:
        return self.fingerprint

    def encode_voice(self, inputs: Inputs) -> bytes:
        """An uploaded voice for storing: the reference's codes, its RMS and transcript."""
        params = parse_omnivoice_params(decode_params(inputs.scalar(PARAMS, "")))
        if params.ref_audio is None:
            raise InvalidRequest("an OmniVoice voice is stored from ref_audio with ref_text")
        codes, ref_text, rms = self.reference(params)
        return pack_voice(FAMILY.name, self.fingerprint,
                          {"codes": codes.astype(np.int64), "rms": np.asarray([rms], np.float32)},
                          ref_text=ref_text)

    @staticmethod
    def reference_audio(data: bytes) -> np.ndarray:
        return reference_recording(data, SAMPLE_RATE_HZ, MIN_REF_SECONDS, MAX_REF_SECONDS)


class OmniVoiceGeneratorStage(Stage):
    """Runs the unmasking loop over Triton's batch at once (one batch per step count). A
    segment that clones its stream's first segment waits for it: in the same batch it runs
    after it; from an earlier batch its codes are kept here, by stream, until the stream's
    last segment (one instance, so every segment of a stream comes here)."""

    uses_torch = True

    def __init__(self, context: StageContext, checkpoint: OmniVoiceCheckpoint | None = None):
        from ...nn.runtime import stage_runner
        from .generator import load_generator, logits_graph

        super().__init__(context)
        checkpoint = checkpoint or context.open_checkpoint(FAMILY)
        self.model = load_generator(checkpoint, context.device)
        self.model.logits_runner = stage_runner(logits_graph(self.model), context)
        self.first_codes = LRU(1024)

    def run(self, inputs: Inputs) -> dict[str, Any]:
        result = self.run_batch([inputs])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def run_batch(self, batch: list[Inputs], ready=None) -> list[dict[str, Any] | Exception]:
        """Groups of one step count, each sent (ready) as soon as it is done: a first segment
        leaves before the later segments of its stream that were batched with it are run."""
        from .generator import UnmaskJob, UnmaskSettings, unmask

        def done(i, result):
            results[i] = result
            if ready is not None:
                ready(i, result)

        results: list[dict[str, Any] | Exception | None] = [None] * len(batch)
        waiting = list(range(len(batch)))
        while waiting:
            runnable = [i for i in waiting if not bool(batch[i].scalar("from_first"))
                        or self.first_codes.get(int(batch[i].scalar(STREAM_ID))) is not None]
            if not runnable:    # their first segment failed, was cancelled or was forgotten
                for i in waiting:
                    done(i, RuntimeError("the stream's first segment is not available"))
                break
            # One segment per stream per call: the batch's row count changes its float sums,
            # so a stream's own segments queued together would sample otherwise than alone.
            runnable = one_row_per_stream(batch, runnable)[0]
            waiting = [i for i in waiting if i not in runnable]
            jobs = {}
            for i in runnable:
                inputs = batch[i]
                ids = torch.from_numpy(np.array(inputs["ids"], np.int64)).T.contiguous()
                frames, audio_start = int(inputs.scalar("frames")), int(inputs.scalar("audio_start"))
                if bool(inputs.scalar("from_first")):
                    codes = self.first_codes.get(int(inputs.scalar(STREAM_ID)))
                    ids[:, audio_start:audio_start + codes.shape[1]] = codes
                settings = UnmaskSettings(num_steps=int(inputs.scalar("num_steps")),
                                          guidance_scale=float(inputs.scalar("guidance_scale")))
                jobs[i] = UnmaskJob(ids, audio_start, frames, int(inputs.scalar("seed")), settings)
            for steps in sorted({job.settings.num_steps for job in jobs.values()}):
                group = [i for i in jobs if jobs[i].settings.num_steps == steps]
                try:
                    codes = unmask(self.model, [jobs[i] for i in group],
                                   cancelled=lambda: all(batch[i].cancelled() for i in group))
                except Exception as exc:  # noqa: BLE001 - this group's requests fail
                    for i in group:
                        done(i, exc)
                    continue
                for i, c in zip(group, codes):
                    inputs = batch[i]
                    stream = int(inputs.scalar(STREAM_ID))
                    final = bool(inputs.scalar(IS_FINAL))
                    if int(inputs.scalar(CHUNK_INDEX)) == 0 and not final:
                        self.first_codes.put(stream, c.cpu())
                    elif final:
                        self.first_codes.pop(stream)
                    done(i, {"codes": c.T.cpu().numpy().astype(np.int32)})
        return results


class OmniVoiceDecoderStage(GroupedStage):
    """Codes -> audio, stateless (a segment decodes whole), shaped as the reference shapes
    its output: the cloned recording's loudness (or a 0.5 peak), 0.1 s fades, 0.1 s of
    silence each side (which also parts the segments). The batcher's segments of equal
    length decode in one call (the convolutional decoder has no mask, so lengths are not
    mixed), each then shaped alone."""

    uses_torch = True

    def __init__(self, context: StageContext, checkpoint: OmniVoiceCheckpoint | None = None):
        from ...nn.higgs_codec import decoder_graph, load_codec_decoder
        from ...nn.runtime import stage_runner

        super().__init__(context)
        checkpoint = checkpoint or context.open_checkpoint(FAMILY)
        self.device = torch.device(context.device)
        self.decoder = load_codec_decoder(checkpoint.codec_dir, self.device)
        self.runner = stage_runner(decoder_graph(self.decoder), context)
        self.quantizers = self.decoder.cfg.num_quantizers

    def batch_key(self, inputs: Inputs) -> Any:
        codes = np.asarray(inputs["codes"])
        if codes.ndim != 2 or codes.shape[1] != self.quantizers or not codes.shape[0]:
            raise InvalidRequest(f"codes must be [frames, {self.quantizers}] with at least one frame, "
                                 f"got {list(codes.shape)}")
        return codes.shape[0]

    @torch.no_grad()
    def run_group(self, members: list[Inputs]) -> list[dict[str, Any]]:
        codes = torch.from_numpy(np.stack([np.asarray(m["codes"], np.int64).T for m in members])).to(self.device)
        audio = self.runner(codes)[0].float().cpu().numpy()
        return [{AUDIO: shape_output(row, float(m.scalar("ref_rms")), float(m.scalar("speed"))),
                 SAMPLE_RATE: SAMPLE_RATE_HZ} for row, m in zip(audio, members)]


def shape_output(audio: np.ndarray, ref_rms: float, speed: float = 1.0) -> np.ndarray:
    """Loudness as upstream's post-processing sets it, fades and silence each side (their
    length / speed, so a sped request lasts its speed-1 length / speed, pads included)."""
    if 0 < ref_rms < REFERENCE_RMS:
        audio = audio * (ref_rms / REFERENCE_RMS)
    elif ref_rms <= 0:
        peak = float(np.abs(audio).max(initial=0.0))
        if peak > 1e-6:
            audio = audio * (PEAK / peak)
    audio = np.clip(audio, -1.0, 1.0).astype(np.float32)
    fade = min(int(FADE_SECONDS / speed * SAMPLE_RATE_HZ), audio.size // 2)
    if fade > 0:
        ramp = np.linspace(0, 1, fade, dtype=np.float32)
        audio[:fade] *= ramp
        audio[-fade:] *= ramp[::-1]
    pad = np.zeros(int(PAD_SECONDS / speed * SAMPLE_RATE_HZ), np.float32)
    return np.concatenate([pad, audio, pad])
