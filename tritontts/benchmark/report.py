"""The benchmark's report: one JSON with everything, a Markdown table per model, PNG plots."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any


def machine() -> dict[str, Any]:
    """What the numbers were measured on (they mean little without it)."""
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=Path(__file__).resolve().parent).stdout.strip()
    except OSError:
        commit = ""
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit}


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1000:.0f}"


def _num(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [f"Measured {m['date']} on {m['cpu']} ({m['cores']} cores), commit {m['commit']}, "
             f"{report['seconds_per_level']:g} s per concurrency level.", ""]
    for model, result in report["models"].items():
        lines += [f"### {model}", "",
                  "| c | requests | ok | 429/503 | errors | TTFA p50 / p95 / p99 (ms) | "
                  "RTF p50 / p95 | audio-s/s | worst gap (ms) | underruns (requests) |",
                  "|---:|---:|---:|---:|---:|---|---|---:|---:|---|"]
        for s in result["levels"]:
            lines.append(
                f"| {s['concurrency']} | {s['requests']} | {s['ok']} | {s['rejected']} | "
                f"{s['errors']} | {_ms(s['ttfa_p50'])} / {_ms(s['ttfa_p95'])} / {_ms(s['ttfa_p99'])} | "
                f"{_num(s['rtf_p50'])} / {_num(s['rtf_p95'])} | {_num(s['audio_s_per_s'])} | "
                f"{_ms(s['worst_gap'])} | {s['underruns']} ({s['requests_with_underruns']}) |")
        errors = sorted({e for s in result["levels"] for e in s["first_errors"]})
        if errors:
            lines += ["", "Errors seen: " + "; ".join(f"`{e}`" for e in errors)]
        if result.get("perf"):
            lines += ["", "perf_analyzer `--streaming` (latency: request sent → its last response):", "",
                      "| model | c | requests/s | responses/s | p50 / p95 / p99 (ms) |",
                      "|---|---:|---:|---:|---|"]
            for name, rows in result["perf"].items():
                if isinstance(rows, dict):
                    lines.append(f"| {name} | – | – | – | failed: {rows['error'][:160]} |")
                    continue
                for r in rows:
                    lines.append(f"| {name} | {r['concurrency']} | {r['throughput']:.2f} | "
                                 f"{_num(r.get('responses_per_s'))} | "
                                 f"{r['p50']:.0f} / {r['p95']:.0f} / {r['p99']:.0f} |")
        if result.get("overhead"):
            from .overhead import markdown as overhead_markdown
            lines += [""] + overhead_markdown(model, result["overhead"])
        if result.get("plot"):
            lines += ["", f"![{model}]({result['plot']})"]
        lines.append("")
    return "\n".join(lines)


def plot(model: str, levels: list[dict[str, Any]], path: Path) -> Path:
    """Four panels against concurrency: time to first audio, real-time factor, audio
    seconds per second, worst gap with underruns."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = [s["concurrency"] for s in levels]

    def series(key, scale=1.0):
        return [None if s[key] is None else s[key] * scale for s in levels]

    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    (ttfa, rtf), (rate, gaps) = axes
    for q in ("p50", "p95", "p99"):
        ttfa.plot(c, series(f"ttfa_{q}", 1000), marker="o", label=q)
    ttfa.set(title="time to first audio", ylabel="ms")
    for q in ("p50", "p95"):
        rtf.plot(c, series(f"rtf_{q}"), marker="o", label=q)
    rtf.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="real time")
    rtf.set(title="real-time factor (wall / audio)", ylabel="RTF")
    rate.plot(c, series("audio_s_per_s"), marker="o")
    rate.set(title="throughput", ylabel="audio seconds per second")
    gaps.plot(c, series("worst_gap", 1000), marker="o", label="worst gap (ms)")
    twin = gaps.twinx()
    twin.bar(c, [s["requests_with_underruns"] for s in levels], alpha=0.3, color="red",
             width=[max(0.4, x * 0.3) for x in c], label="requests with underruns")
    twin.set_ylabel("requests with underruns")
    twin.set_ylim(0, max(1, *(s["requests_with_underruns"] for s in levels)) * 1.1)
    gaps.set(title="stream gaps", ylabel="ms")
    for ax in (ttfa, rtf, rate, gaps):
        ax.set_xscale("log", base=2)
        ax.set_xticks(c, [str(x) for x in c])
        ax.set_xlabel("concurrent streams")
        ax.grid(alpha=0.3)
    ttfa.legend()
    rtf.legend()
    fig.suptitle(f"{model}: streaming through the OpenAI front")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def write(report: dict[str, Any], out: Path) -> dict[str, Path]:
    """results.json, report.md and one PNG per model under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    for model, result in report["models"].items():
        if result["levels"]:
            result["plot"] = plot(model, result["levels"], out / f"{model}.png").name
    paths = {"json": out / "results.json", "markdown": out / "report.md"}
    paths["json"].write_text(json.dumps(report, indent=1))
    paths["markdown"].write_text(markdown(report))
    return paths
