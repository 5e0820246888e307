"""The benchmark's arithmetic: what a listener hears, percentiles, perf_analyzer input data
(no server: these are the numbers every report is built from)."""
from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from tritontts.benchmark.load import Level, RequestResult, count_underruns, percentile, request_bodies
from tritontts.benchmark.perf import input_data


def test_a_stream_that_stays_ahead_of_playback_has_no_underruns():
    # 1 s of audio every 0.5 s: the buffer only grows
    assert count_underruns([(0.2 + 0.5 * k, 1.0) for k in range(6)]) == 0


def test_a_piece_arriving_after_the_buffer_ran_dry_is_one_underrun():
    # 1 s played from t=0.2; the next piece comes at t=1.5 (dry from 1.2): one stall,
    # after which playback restarts from 1.5 and 1.5 + 1 = 2.5 covers the piece at 2.4
    assert count_underruns([(0.2, 1.0), (1.5, 1.0), (2.4, 1.0)]) == 1


def test_underruns_follow_the_stalled_player_not_the_original_schedule():
    # without resuming at the late arrival, the third piece would also count as late
    assert count_underruns([(0.0, 0.5), (2.0, 0.5), (2.4, 0.5), (3.5, 0.5)]) == 2
    assert count_underruns([]) == 0


def test_percentile_interpolates_and_ignores_missing_values():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    assert percentile([None, 1.0, float("inf"), 3.0], 100) == 3.0
    assert percentile([], 50) is None


def test_level_summary_counts_rejections_apart_from_errors_and_rates_only_good_requests():
    good = RequestResult(chars=10, status=200, first_audio=0.1, wall=1.0,
                         pieces=[(0.1, 1.0), (0.9, 1.0)])
    busy = RequestResult(chars=10, status=429, error="busy", wall=0.01)
    broken = RequestResult(chars=10, status=500, error="boom", wall=0.5)
    s = Level(2, [good, busy, broken], wall=2.0).summary()
    assert (s["requests"], s["ok"], s["rejected"], s["errors"]) == (3, 1, 1, 1)
    assert s["first_errors"] == ["boom"]
    assert s["ttfa_p50"] == pytest.approx(0.1) and s["rtf_p50"] == pytest.approx(0.5)
    assert s["audio_s_per_s"] == pytest.approx(1.0)          # 2 audio-s in 2 s
    assert s["worst_gap"] == pytest.approx(0.8) and s["underruns"] == 0


def test_request_bodies_stream_raw_pcm_with_a_seed_per_request_only_when_the_family_takes_one():
    seeded = request_bodies("piper", {"speed": 1.1}, seeded=True, texts=("a", "b"))
    assert [seeded(i)["input"] for i in range(3)] == ["a", "b", "a"]
    assert seeded(2)["seed"] == 2 and seeded(0)["speed"] == 1.1
    assert seeded(0)["stream_format"] == "audio" and seeded(0)["response_format"] == "pcm"
    assert "seed" not in request_bodies("x", {}, seeded=False)(0)


def test_stage_input_data_gives_each_entry_its_own_whole_stream():
    tensors = {"phoneme_ids": np.array([[1, 2, 3]], dtype=np.int64),
               "stream_id": np.array([[42]], dtype=np.int64),
               "is_final": np.array([[False]]),
               "voice": np.array([[b"joe"]], dtype=np.object_),
               "blob": np.array([[b"\xff\x00"]], dtype=np.object_)}
    data = input_data(tensors, batched=True, entries=3)["data"]
    assert [e["stream_id"]["content"][0] for e in data] == [7_000_000, 7_000_001, 7_000_002]
    assert all(e["is_final"]["content"] == [True] for e in data)
    assert data[0]["phoneme_ids"] == {"content": [1, 2, 3], "shape": [3]}   # batch dim dropped
    assert data[0]["voice"] == {"content": ["joe"], "shape": [1]}
    raw = base64.b64decode(data[0]["blob"]["b64"])                      # not UTF-8: length-prefixed
    assert raw == (2).to_bytes(4, "little") + b"\xff\x00"
    json.dumps(data)


def test_the_released_size_report_has_a_row_per_family_served_or_refused_with_its_reason():
    from tritontts.benchmark.released import report

    served = {"family": "a", "refused": None, "cold_start_s": 95.2, "warm_start_s": 41.0, "peak_pss_gib": 9.5,
              "one": {"status": 200, "first_audio_s": 1.25, "audio_s": 4.0, "wall_s": 8.0, "rtf": 2.0},
              "concurrent": {"requests": 4, "served": 4, "wall_s": 20.5}, "kv_capacity": {"a_talker": 4.0},
              "preemptions": 0, "machine": {"date": "2026-12-06 06:36 UTC", "cpu": "Some CPU", "commit": "abc1234"}}
    refused = {"family": "b", "refused": "b_talker: does not fit: weights 16.00 GiB | KV", "cold_start_s": None,
               "peak_pss_gib": 1.0}
    flagged = {**served, "family": "c", "flags": ["--request-timeout", "3600"], "preemptions": 3}
    rows = report([served, refused, flagged]).splitlines()
    on = "2026-12-06 06:36 UTC, Some CPU, abc1234"
    assert f"| a | {on} | yes | 95 s | 41 s | 9.5 GiB | 1.25 s | 2.00 | 4/4 in 20.5 s | a_talker: 4.00 | 0 |" in rows
    assert any(r.startswith("| b | ?, ?, ? | no: b_talker: does not fit: weights 16.00 GiB / KV |") for r in rows)
    assert f"| c (`--request-timeout 3600`) | {on} | yes | 95 s | 41 s | 9.5 GiB | 1.25 s | 2.00 | " \
           "4/4 in 20.5 s | a_talker: 4.00 | 3 |" in rows


def test_the_batching_benchmark_runs_a_batch_as_one_call_on_and_request_by_request_off():
    import numpy as np

    from pathlib import Path

    from tritontts.benchmark.batching import measure_case, table
    from tritontts.family import BatchCase
    from tritontts.serving.stage import GroupedStage, Inputs, StageContext

    calls: list[int] = []

    class Counting(GroupedStage):
        def batch_key(self, inputs):
            return inputs["x"].shape

        def run_group(self, members):
            calls.append(len(members))
            return [{"y": m["x"] * 2} for m in members]

    stage = Counting(StageContext("counting", Path(".")))
    case = BatchCase("counting", lambda context: stage, lambda k: Inputs(x=np.full(3, k)), 0.5, "3 values")
    rows = measure_case(case, stage, batches=(1, 4), rounds=2)
    # the set-up call (1), then per size on/off alternating over 2 rounds: 1,[1], then 4,[1,1,1,1] twice
    assert calls == [1] + [1, 1, 1, 1] + [4, 1, 1, 1, 1, 1, 1, 1, 1, 4]
    assert [r["batch"] for r in rows] == [1, 4]
    assert rows[1]["on"]["audio_s_per_s"] == pytest.approx(rows[1]["on"]["requests_per_s"] * 0.5)
    assert "| counting | 3 values | 4 |" in table([{"family": "f", **r} for r in rows])


def test_the_drift_benchmark_rebuilds_a_talkers_frames_and_counts_the_leading_frames_that_agree():
    import numpy as np

    from tritontts.benchmark.dtype_drift import compare, frames

    def r(rows, **scalars):
        return {"codes": np.array([rows]), **{k: np.array([[v]]) for k, v in scalars.items()}}

    # codes streamed with context: each chunk's new frames only
    streamed = [r([[1], [2]], left_context=0, right_context=1), r([[1], [2], [3], [4]], left_context=1, right_context=0)]
    assert frames(streamed, "codes").reshape(-1).tolist() == [1, 2, 3, 4]
    # all of a segment so far in each response: the response that ends each segment
    segments = [r([[1]], segment_end=False), r([[1], [2]], segment_end=True), r([[7]], segment_end=False),
                r([[7], [8]], segment_end=True)]
    assert frames(segments, "codes").reshape(-1).tolist() == [1, 2, 7, 8]
    a = np.array([[1, 1], [2, 2], [3, 3]])
    assert compare(a, a)["all_agree"] and compare(a, a)["frames_agreeing"] == 3
    other = compare(a, np.array([[1, 1], [2, 9], [3, 3]]))
    assert other["frames_agreeing"] == 1 and not other["all_agree"]
    floats = compare(a.astype(np.float32), a.astype(np.float32) + 0.5)
    assert floats["max_abs_diff"] == 0.5 and not floats["all_agree"]


def test_the_dtype_speed_table_gives_bf16_over_fp32_and_names_an_arm_that_did_not_start():
    from tritontts.benchmark.dtype_speed import table

    def arm(alone, together):
        return {"refused": None, "alone": {"frames_per_s": alone}, "at_once": {"frames_per_s": together}}

    rows = [{"family": "a", "stage": "a_talker", "arms": {"float32": arm(4.0, 10.0), "bfloat16": arm(5.0, 4.0)}},
            {"family": "b", "stage": "b_talker",
             "arms": {"float32": {"refused": "b_talker: does not fit: weights 21 GiB"}, "bfloat16": arm(2.0, 6.0)}}]
    text = table(rows)
    assert "| a | a_talker | 4.00 / 10.00 | 5.00 / 4.00 | 1.25x | 0.40x |" in text
    assert "| b | b_talker | does not start: b_talker: does not fit: weights 21 GiB | 2.00 / 6.00 | - | - |" in text
