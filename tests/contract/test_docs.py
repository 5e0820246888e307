"""The docs stay true to the code: the README's family table is the one the descriptors
generate, every registered family has its page, the README stays short, and every relative
link in the README and docs/ points at a file that exists."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tritontts.deploy.family_table import (
    BEGIN, END, FIELDS_BEGIN, family_table, page_path, with_fields, with_table)
from tritontts.families import FAMILIES

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
PAGES = sorted([README, *(REPO / "docs").rglob("*.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_the_readme_family_table_is_the_generated_one():
    text = README.read_text()
    assert with_table(text) == text, "run python -m tritontts.deploy.family_table"
    block = text[text.index(BEGIN):text.index(END)]
    assert all(f"[{name}](docs/families/{name}.md)" in block for name in FAMILIES)


def test_a_descriptor_change_makes_the_table_stale(monkeypatch):
    """Control: the check above can fail."""
    from dataclasses import replace

    family = FAMILIES["gepard"]
    monkeypatch.setitem(FAMILIES, "gepard", replace(family, description="something else"))
    assert family_table() not in README.read_text()


def test_every_family_has_its_page_and_every_page_a_family():
    pages = {p.stem for p in (REPO / "docs" / "families").glob("*.md")}
    assert pages == set(FAMILIES)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_page_shows_the_fields_its_request_module_declares(name):
    text = page_path(name).read_text()
    assert FIELDS_BEGIN in text and with_fields(text, name) == text, \
        "run python -m tritontts.deploy.family_table"
    fields = FAMILIES[name].fields
    assert all(f"| `{field}` |" in text for field in fields.known)


def test_the_readme_is_short():
    assert len(README.read_text().splitlines()) <= 250


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        if not path.exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(REPO)}: {broken}"


def test_the_clients_help_lists_what_each_family_declares_it_takes():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "tritontts.client.speak", "--help"], capture_output=True,
                         text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    for name, family in FAMILIES.items():
        line = next(line for line in out.stdout.splitlines() if line.strip().startswith(f"{name}:"))
        assert set(line.split(":", 1)[1].replace(",", " ").split()) == set(family.fields.takes) - {"voice_features"}
