"""What a user sees while `python -m frontend` starts: each model's load state as it
changes, then the serving banner."""
from __future__ import annotations

STACK_FAMILIES = ("piper",)


def test_the_launcher_reports_each_models_load_before_the_serving_banner_which_names_the_demo_page(stack):
    log = stack.log.read_text()
    banner = log.index("Serving piper at")
    for model in ("piper_text", "piper_vits", "piper", "tritontts_cancel"):
        line = f"] {model}: READY ("
        assert line in log[:banner], f"no READY line for {model} before the banner:\n{log[:3000]}"
    assert f"demo page: {stack.url}/demo/" in log[banner:]


def test_a_talker_whose_kv_cache_cannot_fit_stops_the_launch_with_the_numbers(random_checkpoints, caches,
                                                                              tmp_path):
    """--kv-requests far past the machine's memory: the talker refuses before its engine
    loads, naming weights, KV per request and what fits; the launcher exits, nothing stays up."""
    import subprocess
    import time

    from tritontts.deploy.profiles import engine_settings_path
    from tritontts.deploy.repository import STAGE_REPOSITORY
    from tritontts.families import FAMILIES
    from tritontts.testing.stack import Stack

    family = next(f for f in sorted(FAMILIES) if FAMILIES[f].write_random_checkpoint
                  and any(engine_settings_path(STAGE_REPOSITORY / s) for s in FAMILIES[f].stages))
    stack = Stack(tmp_path, (family,), random_checkpoints.for_families((family,)), caches,
                  extra_args=("--kv-requests", str(10 ** 7)))
    began = time.monotonic()
    try:
        try:
            stack.start(timeout=400)
            raise AssertionError("the launch did not stop")
        except RuntimeError as exc:
            message = str(exc)
        assert "launcher exited 1" in message and "tritonserver did not start" in message, message[-3000:]
        assert "does not fit: weights" in message and "KV for 10000000 requests" in message
        assert "GiB available" in message
        assert time.monotonic() - began < 400
        left = subprocess.run(["pgrep", "-f", "--", f"--grpc-port={stack.grpc_port}"],
                              capture_output=True, text=True).stdout.split()
        assert not left, left
    finally:
        stack.stop()
