"""Voxtral TTS at released size (the Ministral-3B backbone, the 3-layer acoustic transformer,
the codec; sizes partly inferred, see tritontts/families/voxtral_tts/random_checkpoint.py) with random
weights, on this machine, in one run:

1. talker frames per second: our vLLM talker (paged attention, the acoustic transformer
   inside each step, batched across requests, each request's own noise) vs the reference
   loop (tritontts.families.voxtral_tts.upstream.voxtral_upstream_frames: transformers' Mistral with
   its KV cache + vLLM-Omni 0.30's FlowMatchingAudioTransformer per frame, the batch's rows
   in one forward), fp32 both, batch 1 and 8 (the same prompt 8 times), equal CPU threads
   (each arm in a process of its own: tritontts/benchmark/arms.py). A request ends early
   only if its frame's semantic code is END_AUDIO: each arm counts the frames it really
   made up to there;
2. served through tritonserver + the front: time to first audio and real-time factor at
   concurrency 1 and 4 (streaming PCM), preset voice.

  .venv/bin/python -m tritontts.families.voxtral_tts.benchmark [--checkpoint DIR] [--frames 30]
                                                    [--threads 2] [--skip-talker] [--skip-serving]

Without --checkpoint a random released-size checkpoint is written to .cache/ once (bf16, as
released: 7.9 GB; each arm holds it in float32, 16 GB, one arm at a time).
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from tritontts.benchmark.arms import TalkerBenchmark, talker_benchmark_main, vllm_frame_speed
from tritontts.benchmark.served import measure_served
from tritontts.testing.stack import REPO

TEXTS = ["The birch canoe slid on the smooth planks.", "Glue the sheet to the dark blue background.",
         "It's easy to tell the depth of a well.", "These days a chicken leg is a rare dish."]
VOICE = "casual_male"
CFG = 1.2


def prompt_ids(checkpoint) -> torch.Tensor:
    from mistral_common.protocol.speech.request import SpeechRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    tokenizer = MistralTokenizer.from_file(str(checkpoint.path("tekken.json")))
    request = SpeechRequest(input=TEXTS[0], voice=VOICE)
    return torch.tensor(tokenizer.instruct_tokenizer.encode_speech_request(request).tokens)


def audio_frames(frames: torch.Tensor) -> int:
    """Frames [n, 37] of one request -> how many come before its first END_AUDIO."""
    from tritontts.families.voxtral_tts.acoustic import END_AUDIO

    ended = (frames[:, 0] == END_AUDIO).nonzero()
    return int(ended[0]) if len(ended) else int(frames.shape[0])


def vllm_speed(checkpoint, frames: int, batches=(1, 8)) -> dict[int, float]:
    from tritontts.families.voxtral_tts.vllm_model import (
        EOS, VoiceStream, prepare_vllm_talker, register)

    register()
    ids, voice = prompt_ids(checkpoint), checkpoint.voice_embedding(VOICE)
    return vllm_frame_speed(prepare_vllm_talker(checkpoint, REPO / ".cache"), ids.tolist(),
                            lambda k: VoiceStream(ids, voice, torch.Generator().manual_seed(k), CFG),
                            lambda got: audio_frames(torch.stack(got)) if got else 0, EOS, frames, batches)


def reference_speed(checkpoint, frames: int, batches=(1, 8)) -> dict[int, float]:
    from tritontts.weights.checkpoint import read_tensors
    from tritontts.families.voxtral_tts.upstream import voxtral_upstream_frames, voxtral_upstream_talker
    from tritontts.families.voxtral_tts.checkpoint import WEIGHTS_FILE
    from tritontts.families.voxtral_tts.talker import (
        CODEBOOK_EMBEDDINGS, FrameEmbeddings, place_voice)

    backbone, acoustic = voxtral_upstream_talker(checkpoint)
    c = checkpoint.config
    embed_frames = FrameEmbeddings(c.acoustic, c.backbone.dim)
    embed_frames.table.weight.data = read_tensors(checkpoint.path(WEIGHTS_FILE),
                                                  CODEBOOK_EMBEDDINGS, strip=False)[CODEBOOK_EMBEDDINGS].float()
    ids = prompt_ids(checkpoint)
    with torch.no_grad():
        # The backbone's embedding table is the text embedding table: the prompt from it.
        prompt = place_voice(backbone.embed_tokens(ids), ids, checkpoint.voice_embedding(VOICE), c.audio_token_id)
    torch.manual_seed(0)
    voxtral_upstream_frames(backbone, acoustic, embed_frames, prompt[None], 2, CFG)      # warm-up
    speed = {}
    for batch in batches:
        start = time.perf_counter()
        out = voxtral_upstream_frames(backbone, acoustic, embed_frames, prompt[None].expand(batch, -1, -1),
                                       frames, CFG)
        wall = time.perf_counter() - start
        made = sum(audio_frames(row) for row in out)
        speed[batch] = made / wall
        print(f"reference loop, batch {batch}: {made} frames in {wall:.1f} s = {speed[batch]:.2f} frames/s",
              flush=True)
    return speed  # each arm runs in a process of its own: the model goes with it


def released() -> Path:
    from tritontts.families.voxtral_tts.random_checkpoint import write_random_checkpoint

    root = REPO / ".cache" / "voxtral-tts-released"
    if not (root / "voice_embedding" / f"{VOICE}.pt").exists():
        write_random_checkpoint(root, size="released")
    return root


def serving(root: Path, frames: int) -> None:
    # A chunk's frames take seconds each at this size on a CPU: the front's stall and
    # request limits are raised past that.
    measure_served("voxtral_tts", root, lambda k: {"input": TEXTS[k % len(TEXTS)], "voice": VOICE, "seed": k,
                                                   "max_new_tokens": frames},
                   stall_timeout=3600, request_timeout=7200)


def main() -> None:
    from tritontts.families.voxtral_tts.checkpoint import open_checkpoint

    talker_benchmark_main(TalkerBenchmark(
        script=Path(__file__), doc=__doc__, open_checkpoint=open_checkpoint,
        arms={"vllm": vllm_speed, "reference": reference_speed}, work="frames", work_default=30,
        work_help="frames per request (12.5 a second)", unit="frames", released=released, serve=serving))


if __name__ == "__main__":
    main()
