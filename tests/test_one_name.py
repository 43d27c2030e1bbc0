"""One name per meaning: a public top-level class or function name is defined in one capplan
module only, so ``Timeline``, ``make_plan`` or ``FailureSpec`` mean one thing wherever a reader
meets them. Re-exports are imports, not definitions, and do not count. The exceptions are few and
said here: a protocol every module of a package implements (by package), and names whose two
definitions mean the same thing (to merge, not to rename), each with its reason.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "capplan"

#: name → (package whose modules may each define it, why)
BY_PACKAGE = {
    "cmd": ("capplan.commands.", "each command module's entry point, called through the CLI's table"),
    "parse": ("capplan.importers.", "the importer protocol: <tool>.parse(paths) -> runs"),
    "sniff": ("capplan.importers.", "the importer protocol: <tool>.sniff(obj) detects the format"),
    "find_file": ("capplan.importers.", "an importer's own search for its result file"),
    "find_files": ("capplan.importers.", "an importer's own search for its result files"),
}

#: name → (the exact modules that define it, why it is allowed)
SAME_MEANING: dict[str, tuple[set[str], str]] = {}


def public_definitions(root: Path = ROOT) -> dict[str, set[str]]:
    """Public top-level class and function names → the modules that define them."""
    found: dict[str, set[str]] = defaultdict(set)
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        module = module.removesuffix(".__init__")
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if (isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                    and not node.name.startswith("_")):
                found[node.name].add(module)
    return found


def test_each_public_name_is_defined_once():
    clashes = {}
    for name, modules in public_definitions().items():
        if len(modules) < 2:
            continue
        if name in BY_PACKAGE and all(m.startswith(BY_PACKAGE[name][0]) for m in modules):
            continue
        if name in SAME_MEANING and modules == SAME_MEANING[name][0]:
            continue
        clashes[name] = sorted(modules)
    assert not clashes, f"one name, several definitions (rename by meaning, or say why here): {clashes}"


def test_the_allow_lists_are_current():
    found = public_definitions()
    stale = [n for n, (mods, _) in SAME_MEANING.items() if found.get(n, set()) != mods]
    stale += [n for n, (pkg, _) in BY_PACKAGE.items()
              if len(found.get(n, ())) < 2 or not all(m.startswith(pkg) for m in found[n])]
    assert not stale, f"allowed but no longer defined as listed: {stale}"


def test_a_clash_is_found(tmp_path):
    """The walk sees a second definition (and not an import) of a name."""
    pkg = tmp_path / "capplan"
    (pkg / "a").mkdir(parents=True)
    (pkg / "a" / "__init__.py").write_text("from .x import Thing\n")
    (pkg / "a" / "x.py").write_text("class Thing:\n    pass\n\ndef _private():\n    pass\n")
    (pkg / "b.py").write_text("def Thing():\n    pass\n\ndef _private():\n    pass\n")
    found = public_definitions(pkg)
    assert found == {"Thing": {"capplan.a.x", "capplan.b"}}
