"""docs/architecture.md "The rooms" names every module and package of capplan/ and nothing else:
a new module without a row, or a row left behind by a move, fails here. A package's modules may
have rows of their own (``plan.spec``); each must exist. Read at test time from
the tree, so a package that replaces loose modules (``plan/``) needs only its row."""

from __future__ import annotations

import re
from pathlib import Path

import capplan

ROOT = Path(capplan.__file__).resolve().parent
DOC = ROOT.parent / "docs" / "architecture.md"


def rooms_on_disk(root: Path = ROOT) -> set[str]:
    """Top-level modules as ``name``, subpackages as ``name/`` (``__init__`` is the package row)."""
    mods = {p.stem for p in root.glob("*.py") if p.stem != "__init__"}
    pkgs = {p.name + "/" for p in root.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    return mods | pkgs


def rooms_in_table(text: str) -> set[str]:
    """The backticked names of the first column of the table under '## The rooms'."""
    section = text.split("\n## The rooms", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    rows = [ln for ln in section.splitlines() if ln.startswith("|") and not ln.startswith("|---")]
    assert rows and rows[0].startswith("| module |"), "the rooms table lost its header"
    for ln in rows[1:]:
        first = ln.split("|")[1]
        if first.strip() == "`capplan` (package)":
            continue
        found = re.findall(r"`([^`]+)`", first)
        assert found, f"a row without a module name: {ln[:80]}"
        names |= set(found)
    return names


def submodule_exists(name: str, root: Path = ROOT) -> bool:
    """A dotted row (``plan.spec``) names a module inside a package: it must exist there."""
    *pkg, leaf = name.split(".")
    where = root.joinpath(*pkg)
    return bool(pkg) and (where / "__init__.py").is_file() and (
        (where / f"{leaf}.py").is_file() or (where / leaf / "__init__.py").is_file())


def test_rooms_table_lists_every_module_and_nothing_else():
    disk, table = rooms_on_disk(), rooms_in_table(DOC.read_text(encoding="utf-8"))
    missing = sorted(disk - table)
    stale = sorted(n for n in table - disk if not submodule_exists(n))
    assert not missing, f"docs/architecture.md 'The rooms' misses {missing}: add a row saying its job"
    assert not stale, (f"docs/architecture.md 'The rooms' names {stale}, which capplan/ does not have "
                       "(a package is written `name/`)")


def test_the_check_sees_a_missing_and_a_stale_room(tmp_path):
    (tmp_path / "alpha.py").write_text("")
    (tmp_path / "beta").mkdir()
    (tmp_path / "beta" / "__init__.py").write_text("")
    (tmp_path / "gamma").mkdir()  # not a package: no __init__.py
    assert rooms_on_disk(tmp_path) == {"alpha", "beta/"}
    doc = ("# x\n\n## The rooms\n\n| module | its job |\n|---|---|\n| `alpha` | a |\n"
           "| `beta`, `delta` | b |\n| `capplan` (package) | c |\n\n## Layers\n| `zeta` | z |\n")
    table = rooms_in_table(doc)
    assert table == {"alpha", "beta", "delta"}
    assert rooms_on_disk(tmp_path) - table == {"beta/"} and table - rooms_on_disk(tmp_path) == {"beta", "delta"}
    (tmp_path / "beta" / "inner.py").write_text("")
    assert submodule_exists("beta.inner", tmp_path) and not submodule_exists("beta.outer", tmp_path)
    assert not submodule_exists("alpha.inner", tmp_path)
