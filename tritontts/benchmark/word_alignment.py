"""How far the aligner's word onsets are from the truth, on audio whose word onsets are known:
the Harvard sentences' words, each spoken on its own by the embedded Piper voice (real weights), its silence trimmed,
and the words joined with seeded pauses of 150-500 ms, so each word's onset is where its
first voiced sample was put. `python -m tritontts.benchmark.word_alignment` prints the median and
95th-percentile onset error with the whole audio aligned at once and as a stream delivers
it in 0.5 s chunks, the aligner's CPU time per audio second for each, and the wall time of
one window's alignment (what a chunk that triggers one waits); with --served, the served
cost side by side (served_cost)."""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass

import numpy as np

from ..testing.audio import HARVARD

VOICED_DB = -40.0


@dataclass
class KnownWords:
    audio: np.ndarray
    sample_rate: int
    text: str
    onsets_ms: list[float]


def voiced_span(audio: np.ndarray) -> tuple[int, int]:
    """First and one-past-last sample of `audio` above VOICED_DB of its peak."""
    level = np.abs(audio)
    loud = np.flatnonzero(level > level.max() * 10 ** (VOICED_DB / 20))
    return (int(loud[0]), int(loud[-1]) + 1) if loud.size else (0, 0)


def piper_known_words(sentences=tuple(HARVARD), seed: int = 0) -> KnownWords:
    """The sentences' words, each synthesized alone by the default Piper voice and placed
    after a seeded pause; the text is the sentences as written."""
    from piper import PiperVoice

    from ..alignment.words import split_words
    from ..families.piper.voices import load_voice_table

    spec = load_voice_table().resolve(None)
    voice = PiperVoice.load(spec.model_path)
    rate = voice.config.sample_rate
    rng = np.random.default_rng(seed)
    pieces, onsets, at = [np.zeros(int(0.3 * rate), np.float32)], [], int(0.3 * rate)
    for sentence in sentences:
        for word in split_words(sentence):
            audio = np.concatenate([c.audio_float_array for c in voice.synthesize(word)])
            first, end = voiced_span(audio)
            spoken = audio[first:end].astype(np.float32)
            onsets.append(at * 1000 / rate)
            pause = np.zeros(int(rng.uniform(0.15, 0.5) * rate), np.float32)
            pieces += [spoken, pause]
            at += spoken.size + pause.size
    return KnownWords(np.concatenate(pieces), rate, " ".join(sentences), onsets)


def onset_errors(aligner, known: KnownWords, chunk_seconds: float | None = None) -> tuple[np.ndarray, float]:
    """Each word's |aligned onset - true onset| in ms, and the aligner's CPU seconds: the
    whole audio at once, or with `chunk_seconds` as a stream delivers it (StreamAlignment)."""
    from ..alignment.stream import StreamAlignment

    started = time.process_time()
    if chunk_seconds is None:
        timings = aligner.align(known.audio, known.sample_rate, known.text)
    else:
        stream, step = StreamAlignment(aligner, known.text, known.sample_rate), int(chunk_seconds * known.sample_rate)
        timings = []
        for i in range(0, known.audio.size, step):
            timings += stream.add(known.audio[i:i + step], final=i + step >= known.audio.size)
    cpu = time.process_time() - started
    if len(timings) != len(known.onsets_ms):
        raise AssertionError(f"{len(timings)} words aligned, {len(known.onsets_ms)} spoken")
    return np.abs(np.array([t.start_ms for t in timings]) - np.array(known.onsets_ms)), cpu


def served_cost(rounds: int = 5) -> dict:
    """The served aligner's cost, side by side in one run on the default voice: a Piper
    server without --word-aligner, then one with it asked plainly and asked for
    word_timestamps; each request (three sentences, whole response) in turn, `rounds`
    times, alternating: median seconds per request and the ratios to the plain server."""
    import tempfile
    from pathlib import Path

    import httpx

    from ..testing.stack import Stack

    text = " ".join(HARVARD[:3])
    times: dict[str, list[float]] = {"plain_server": [], "aligned_server_not_asked": [],
                                     "aligned_server_asked": []}
    for arm, extra in (("plain_server", ()), ("aligned_server", ("--word-aligner",))):
        stack = Stack(Path(tempfile.mkdtemp(prefix=f"word-cost-{arm}-")), extra_args=extra).start()
        try:
            asks = (False,) if not extra else (False, True)
            for _ in range(rounds + 1):          # the first round warms up and is not counted
                for asked in asks:
                    body = {"input": text, "seed": 1, **({"word_timestamps": True} if asked else {})}
                    started = time.perf_counter()
                    r = httpx.post(stack.url + "/v1/audio/speech", json=body, timeout=120)
                    r.raise_for_status()
                    key = arm if not extra else f"{arm}_{'asked' if asked else 'not_asked'}"
                    times[key].append(time.perf_counter() - started)
        finally:
            stack.stop()
    median = {k: float(np.median(v[1:])) for k, v in times.items()}
    return {"request_seconds_median": {k: round(v, 3) for k, v in median.items()},
            "ratio_to_plain": {k: round(v / median["plain_server"], 3) for k, v in median.items()},
            "rounds": rounds, "text_words": len(text.split())}


def main(argv=None) -> None:
    from pathlib import Path

    from ..alignment.checkpoints import aligner_kind, load_aligner
    from ..serving.word_aligner import bundled_whisper

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=3, help="pause layouts measured")
    parser.add_argument("--aligner", type=Path, default=None,
                        help="a CTranslate2 Whisper folder or a Qwen3-ForcedAligner checkpoint "
                             "(default: the bundled Whisper tiny.en); one thread, as the stage runs it")
    parser.add_argument("--cost-only", action="store_true",
                        help="only the aligner's cost (CPU per audio second over the whole audio, one "
                             "window's time): for a random checkpoint, whose onsets mean nothing")
    parser.add_argument("--served", action="store_true",
                        help="also the served cost: Piper servers with and without --word-aligner")
    args = parser.parse_args(argv)
    path = args.aligner or bundled_whisper()
    aligner = load_aligner(path, threads=1)
    knowns = [piper_known_words(seed=seed) for seed in range(args.seeds)]
    seconds = sum(k.audio.size / k.sample_rate for k in knowns)
    report = {"aligner": f"{aligner_kind(path)} {path} (1 thread)", "words": sum(len(k.onsets_ms) for k in knowns),
              "audio_seconds": round(seconds, 1)}
    modes = (("whole", None),) if args.cost_only else (("whole", None), ("stream_0.5s_chunks", 0.5))
    for mode, chunk in modes:
        runs = [onset_errors(aligner, k, chunk) for k in knowns]
        errors = np.concatenate([e for e, _ in runs])
        report[mode] = {"cpu_seconds_per_audio_second": round(sum(c for _, c in runs) / seconds, 3)}
        if not args.cost_only:
            report[mode]["onset_error_ms"] = {"median": round(float(np.median(errors)), 1),
                                              "p95": round(float(np.percentile(errors, 95)), 1),
                                              "max": round(float(errors.max()), 1)}
    from ..audio import resample

    audio = resample(knowns[0].audio, knowns[0].sample_rate, 16000)
    words = knowns[0].text.split()
    for seconds in (10, 30):            # the encoder's input for a stream's window; the most
        started = time.perf_counter()
        for _ in range(5):
            aligner.align_window(audio[:seconds * 16000], words[:3 * seconds])
        report[f"one_{seconds}s_window_seconds"] = round((time.perf_counter() - started) / 5, 3)
    if args.served:
        report["served"] = served_cost()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
