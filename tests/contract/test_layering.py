"""The layering of tritontts, as contracts import-linter checks ([tool.importlinter] in
pyproject.toml): each layer imports only the layers below it (shared code never imports a
family), families never import each other, the front names no family, no import cycles
between sibling modules. Function-level imports count. A family's descriptor names its
heavy code by "module:function" (tritontts.family.lazy), so every such name must resolve."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tritontts.families import FAMILIES
from tritontts.family import Lazy

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT_IMPORTS), "--config", str(config), "--no-cache"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def test_the_layering_contracts_are_kept():
    out = lint_imports(REPO / "pyproject.toml")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout and "4 kept" in out.stdout, out.stdout[-2000:]


def test_a_function_level_import_against_a_contract_is_reported(tmp_path):
    """Control: the tool sees an import inside a function (omnivoice's export_graphs imports
    the higgs codec when called) and fails on a contract that forbids it."""
    config = tmp_path / "contracts.toml"
    config.write_text('''[tool.importlinter]
root_packages = ["tritontts", "frontend"]

[[tool.importlinter.contracts]]
name = "omnivoice's stages may not use the higgs codec"
type = "forbidden"
source_modules = ["tritontts.families.omnivoice.stages"]
forbidden_modules = ["tritontts.nn.higgs_codec"]
''')
    out = lint_imports(config)
    assert out.returncode != 0 and "BROKEN" in out.stdout, out.stdout[-2000:]
    assert "tritontts.families.omnivoice.stages -> tritontts.nn.higgs_codec" in out.stdout


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_function_a_descriptor_names_lazily_resolves(name):
    family = FAMILIES[name]
    named = {field: value for field, value in vars(family).items() if isinstance(value, Lazy)}
    for field, value in named.items():
        assert callable(value.resolve()), f"{name}.{field}: {value!r} is not a function"
    if family.checkpoint_required:
        assert "open_checkpoint" in named and "write_random_checkpoint" in named, sorted(named)


def test_the_one_layering_exception_stays_a_leaf():
    """A family's benchmark may import the benchmark and testing helpers (ignore_imports in
    pyproject.toml) because nothing imports it: it is a program, run with python -m."""
    import grimp

    graph = grimp.build_graph("tritontts", "frontend")
    benchmarks = sorted(m for m in graph.modules if m.startswith("tritontts.families.")
                        and m.endswith(".benchmark"))
    assert benchmarks, "no family benchmark found: the check would pass on nothing"
    for module in benchmarks:
        assert not graph.find_modules_that_directly_import(module), module


def test_a_family_benchmark_reruns_itself_as_a_module():
    from tritontts.benchmark.arms import arm_command
    from tritontts.families.gepard import benchmark

    assert arm_command(Path(benchmark.__file__))[1:] == ["-m", "tritontts.families.gepard.benchmark"]
    assert arm_command(REPO / "scripts" / "x.py")[1:] == [str(REPO / "scripts" / "x.py")]
