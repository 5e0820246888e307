"""The front imports no torch, vLLM or transformers, whatever families it serves: a minimal
venv (`setup.sh --minimal`, what `scripts/serve.sh` makes) has none of them.

A fresh interpreter, with those packages made unimportable, runs the front's whole serving
path: `python -m frontend --help`, the app factory over every registered family, every
descriptor's parser on its example request and a speech request per family through the app
(a scripted Triton client stands in for tritonserver). A blocked import fails the test with
the chain of modules that pulled it in.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "vllm", "transformers")

# The child: a meta-path finder that refuses the heavy packages and names the chain of
# modules being executed when one was asked for.
CHILD = textwrap.dedent(r'''
    import sys

    HEAVY = set(sys.argv[1].split(","))
    blocked = []

    class Refuse:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] not in HEAVY:
                return None
            chain, frame = [], sys._getframe(1)
            while frame is not None:
                if frame.f_code.co_name == "<module>":
                    chain.append(frame.f_globals.get("__name__", "?"))
                frame = frame.f_back
            line = " -> ".join(reversed(chain)) + f" -> import {name}"
            blocked.append(line)
            raise ImportError(f"{name} is not importable in the light front: {line}")

    sys.meta_path.insert(0, Refuse())

    def report_and_exit(where, exc=None):
        print(f"FAILED at {where}: {exc!r}" if exc else f"FAILED at {where}")
        for line in dict.fromkeys(blocked):
            print("CHAIN", line)
        sys.exit(1)

    import runpy
    sys.argv = ["frontend", "--help"]
    try:
        runpy.run_module("frontend", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code not in (0, None):
            report_and_exit("python -m frontend --help", exc)
    except BaseException as exc:
        report_and_exit("python -m frontend --help", exc)

    import asyncio
    from fake_triton import FakeTritonClient, serving
    from tritontts.families import FAMILIES

    async def every_family():
        names = list(FAMILIES)
        async with serving(FakeTritonClient(), names) as front:
            for name, family in FAMILIES.items():
                params = family.example_params()
                family.parse_params(dict(params))
                reply = await front.speech(model=name, voice="default", response_format="wav",
                                           **params)
                # 200, or the family's own 4xx for a voice its unset checkpoint would list:
                # either way the request crossed the family's parser in this process.
                assert reply.status_code < 500, (name, reply.status_code, reply.text)
                print("SPOKE", name, reply.status_code)
            for path in ("/v1/models", "/v1/audio/voices", "/health"):
                reply = await front.http.get(path)
                assert reply.status_code < 500, (path, reply.status_code, reply.text)

    try:
        asyncio.run(every_family())
    except BaseException as exc:
        report_and_exit("the app over every family", exc)
    if blocked:
        report_and_exit("(an import was refused and swallowed)")
    print("LIGHT", len(FAMILIES), sorted(m for m in sys.modules if m.partition(".")[0] in HEAVY))
''')


def run_light_front(heavy: tuple[str, ...] = HEAVY) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{REPO}:{REPO / 'tests' / 'front'}",
           "HOME": str(Path.home()), "LANG": "C.UTF-8"}
    return subprocess.run([sys.executable, "-c", CHILD, ",".join(heavy)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_front_serves_every_family_with_torch_vllm_and_transformers_unimportable():
    result = run_light_front()
    chains = [line for line in result.stdout.splitlines() if line.startswith("CHAIN")]
    assert result.returncode == 0, (
        "the front imported a heavy package; import chains:\n" + "\n".join(chains)
        + f"\n--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}")
    from tritontts.families import FAMILIES
    assert f"LIGHT {len(FAMILIES)} []" in result.stdout
    assert sorted(line.split()[1] for line in result.stdout.splitlines()
                  if line.startswith("SPOKE")) == sorted(FAMILIES)


def test_the_light_import_check_names_the_chain_when_a_family_needs_a_blocked_package():
    """Negative control: block a package the front does need (numpy, for its audio
    encoding) and the check must fail, naming the chain from the front's entry point."""
    result = run_light_front(("numpy",))
    assert result.returncode != 0
    chains = [line for line in result.stdout.splitlines() if line.startswith("CHAIN")]
    assert chains, result.stdout + result.stderr
    assert any(line.startswith("CHAIN __main__ -> ") and line.endswith("-> import numpy")
               for line in chains), chains
