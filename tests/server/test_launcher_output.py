"""What a user sees while `python -m frontend` starts: each model's load state as it
changes, then the serving banner."""
from __future__ import annotations

STACK_FAMILIES = ("piper",)


def test_the_launcher_reports_each_models_load_before_the_serving_banner(stack):
    log = stack.log.read_text()
    banner = log.index("Serving piper at")
    for model in ("piper_text", "piper_vits", "piper", "tritontts_cancel"):
        line = f"] {model}: READY ("
        assert line in log[:banner], f"no READY line for {model} before the banner:\n{log[:3000]}"
