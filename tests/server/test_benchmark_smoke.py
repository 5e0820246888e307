"""The benchmark command runs end to end against a live server (a few seconds; its numbers
are reported, never asserted: this proves the harness measures, not how fast we are)."""
from __future__ import annotations

import json

from tritontts.benchmark.__main__ import main

STACK_FAMILIES = ("piper",)


def test_benchmark_command_reports_levels_perf_analyzer_rows_overhead_and_plots(stack, tmp_path):
    out = tmp_path / "report"
    assert main(["--url", stack.url, "--grpc-url", stack.grpc_url, "--concurrency", "1,2",
                 "--seconds", "2", "--perf-concurrency", "1", "--perf-requests", "2",
                 "--overhead-rounds", "1", "--no-progress", "--out", str(out)]) == 0
    report = json.loads((out / "results.json").read_text())
    piper = report["models"]["piper"]
    assert [s["concurrency"] for s in piper["levels"]] == [1, 2]
    for s in piper["levels"]:
        assert s["ok"] >= s["concurrency"] and s["errors"] == 0 and s["rejected"] == 0
        assert 0 < s["ttfa_p50"] <= s["ttfa_p99"] and s["audio_s_per_s"] > 0
        assert s["rtf_p50"] > 0 and s["worst_gap"] is not None
    # perf_analyzer drove the ensemble and each stage with the captured tensors (the pooled
    # servers run with --word-aligner: its stage too)
    assert set(piper["perf"]) == {"piper", "piper_text", "piper_vits", "word_aligner"}
    for model, rows in piper["perf"].items():
        assert isinstance(rows, list), f"{model}: {rows}"
        assert rows[0]["concurrency"] == 1 and rows[0]["throughput"] > 0 and rows[0]["p50"] > 0
    # the same requests in-process, over Triton gRPC and through the front all spoke
    for label, paths in piper["overhead"].items():
        assert set(paths) == {"in-process", "triton gRPC", "front HTTP"}, label
        for path, s in paths.items():
            assert s["ok"] == s["requests"] == 1 and s["ttfa_p50"] > 0, (label, path, s)
        assert "rtf_ratio" in paths["front HTTP"]
    assert (out / "piper.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (out / "report.md").read_text()
    assert "### piper" in table and "piper_vits" in table and "Serving overhead" in table and "![piper](piper.png)" in table
