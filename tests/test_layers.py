"""The house has floors: nothing low imports anything high, there are no import circles, and
no private name crosses a module boundary.

Every module under capplan/ belongs to one layer of ``LAYERS`` (the same table, with each
room's job, is in docs/architecture.md#layers). A module may import modules of its own layer
or of a lower one — at the top of the file or inside a function alike: a lazy import is still
a dependency. The imports are read from the source (``ast``): ``import``, ``from … import``
(relative or absolute, under ``if TYPE_CHECKING`` too) and ``importlib.import_module("…")``
with a literal name.

Adding a module: put its name (``timeline``, or a package ``twin``, which covers its
submodules unless one is listed on its own) in the layer where it belongs, here and in the
table of docs/architecture.md.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "capplan"
DOC = ROOT / "docs" / "architecture.md"

#: Lowest first. A name covers the module and, for a package, everything in it; the longest
#: matching name wins. "capplan" is the package itself (its __init__, the public facade).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("errors", "contract", "version", "io")),
    ("kit", ("spec", "slo", "sketch", "earlystop", "resources", "dialect", "present")),
    ("study", ("study", "sparkstudy", "telemetry", "engine_metrics", "importers", "loadtools")),
    ("measures", ("metrics", "validate", "cost", "kv")),
    ("statistics", ("diagnostics", "bootstrap", "reduce", "runeffect", "honesty")),
    ("simulation", ("sim",)),
    ("analyses", ("envelope", "compare", "timeline", "mix", "cache", "twin", "fanout", "burst")),
    ("plan", ("plan", "design", "loadtest")),
    ("presentation", ("glossary", "viz", "export", "notebook", "whatif", "whatif_fleet", "provenance",
                      "nbexec", "next_steps", "report_index", "report", "mix.panel", "mix.page")),
    ("shell", ("commands", "cli", "__main__", "capplan")),
)


def module_name(path: Path) -> str:
    """capplan/sim/config.py → capplan.sim.config; capplan/__init__.py → capplan."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def layer_of(module: str) -> tuple[int, str] | None:
    """(rank, layer name) of a capplan module, or None when no layer declares it."""
    short = "capplan" if module == "capplan" else module.removeprefix("capplan.")
    best = None
    for rank, (name, members) in enumerate(LAYERS):
        for m in members:
            if short == m or short.startswith(m + "."):
                if best is None or len(m) > best[0]:
                    best = (len(m), rank, name)
    return None if best is None else (best[1], best[2])


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported capplan module
    line: int
    names: tuple[str, ...] = ()  # names taken with `from target import names`

    def where(self) -> str:
        return f"{MODULES[self.source].relative_to(ROOT)}:{self.line}"


def _resolve_from(source: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    is_pkg = MODULES[source].name == "__init__.py"
    base = source.split(".")
    base = base if is_pkg else base[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(source: str) -> tuple[list[Import], dict[str, str]]:
    """The capplan imports of a module, and the local names bound to capplan modules."""
    tree = ast.parse(MODULES[source].read_text(encoding="utf-8"))
    found: list[Import] = []
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "capplan" or a.name.startswith("capplan."):
                    found.append(Import(source, a.name, node.lineno))
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else "capplan"
        elif isinstance(node, ast.ImportFrom):
            target = _resolve_from(source, node)
            if not (target == "capplan" or target.startswith("capplan.")):
                continue
            plain: list[str] = []
            for a in node.names:
                sub = f"{target}.{a.name}"
                if sub in MODULES:  # `from . import bootstrap as boot`
                    found.append(Import(source, sub, node.lineno))
                    aliases[a.asname or a.name] = sub
                else:
                    plain.append(a.name)
            if plain:
                found.append(Import(source, target, node.lineno, tuple(plain)))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and node.args[0].value.startswith("capplan")):
            found.append(Import(source, node.args[0].value, node.lineno))
    return [i for i in found if i.target != source], aliases


GRAPH: dict[str, list[Import]] = {}
ALIASES: dict[str, dict[str, str]] = {}
for _m in MODULES:
    GRAPH[_m], ALIASES[_m] = imports_of(_m)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


# ----------------------------------------------------------------------------- the tests


def test_every_module_has_a_layer():
    missing = [m for m in MODULES if layer_of(m) is None]
    assert not missing, (
        "modules in no layer: " + ", ".join(missing) + ". Declare each in LAYERS in "
        "tests/test_layers.py (the layer whose rooms it may use) and in the layer table of "
        "docs/architecture.md.")


def test_imported_modules_exist():
    unknown = [f"{i.where()}: {i.target}" for imps in GRAPH.values() for i in imps
               if i.target not in MODULES]
    assert not unknown, "imports of capplan modules that do not exist:\n" + "\n".join(unknown)


def test_no_lower_layer_imports_a_higher_one():
    bad = []
    for source, imps in GRAPH.items():
        ls = layer_of(source)
        for imp in imps:
            lt = layer_of(imp.target)
            if ls and lt and lt[0] > ls[0]:
                bad.append(f"{imp.where()}: {source} ({ls[1]}) imports {imp.target} ({lt[1]})")
    assert not bad, ("upward imports (a lower layer may not import a higher one, not even "
                     "inside a function; move the code down or the caller up):\n" + "\n".join(bad))


def _cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for imp in GRAPH.get(v, []):
            w = imp.target
            if w not in MODULES:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in MODULES:
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    msgs = []
    for comp in _cycles():
        members = set(comp)
        lines = [f"  {i.where()}: {i.source} imports {i.target}"
                 for m in comp for i in GRAPH[m] if i.target in members]
        msgs.append("circle between " + ", ".join(comp) + ":\n" + "\n".join(lines))
    assert not msgs, "\n".join(msgs)


def test_no_private_name_crosses_a_module():
    bad = []
    for source, imps in GRAPH.items():
        for imp in imps:
            for n in imp.names:
                if _private(n):
                    bad.append(f"{imp.where()}: {source} imports {imp.target}.{n}")
        tree = ast.parse(MODULES[source].read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in ALIASES[source] and _private(node.attr)
                    and ALIASES[source][node.value.id] != source):
                bad.append(f"{MODULES[source].relative_to(ROOT)}:{node.lineno}: {source} uses "
                           f"{ALIASES[source][node.value.id]}.{node.attr}")
    assert not bad, ("private names used outside their module (make the name public where it "
                     "is defined, or keep the code inside):\n" + "\n".join(bad))


def test_architecture_doc_lists_the_same_layers():
    text = DOC.read_text(encoding="utf-8")
    rows = {m.group(2): m.group(0) for m in re.finditer(r"^\| *(\d+) +(\w+) *\|.*$", text, re.M)}
    for rank, (name, members) in enumerate(LAYERS):
        row = rows.get(name)
        assert row is not None, f"docs/architecture.md has no row '| {rank} {name} | … |'"
        assert row.startswith(f"| {rank} "), f"docs/architecture.md: layer {name} is not number {rank}"
        for m in members:
            assert f"`{m}`" in row, f"docs/architecture.md: `{m}` is missing from the {name} row"
    assert len(rows) == len(LAYERS), "docs/architecture.md lists layers that the test does not"


# ----------------------------------------------------------------------------- the checker itself


def test_the_checker_sees_function_level_relative_and_importlib_imports(tmp_path, monkeypatch):
    """A tiny fake package: an upward import inside a function, a circle and a private name
    are all found (so the tests above cannot pass by not looking)."""
    pkg = tmp_path / "capplan"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("def f():\n    from .plan import make\n")
    (pkg / "plan.py").write_text("import importlib\nfrom .errors import _hidden\n"
                                 "importlib.import_module('capplan.sub.x')\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "x.py").write_text("from .. import errors as e\ne._secret()\n")
    here = sys.modules[__name__]
    monkeypatch.setattr(here, "ROOT", tmp_path)
    mods = {module_name(p): p for p in sorted(pkg.rglob("*.py"))}
    monkeypatch.setattr(here, "MODULES", mods)
    graph = {m: imports_of(m) for m in mods}
    edges = {(i.source, i.target, i.names) for imps, _ in graph.values() for i in imps}
    assert ("capplan.errors", "capplan.plan", ("make",)) in edges  # inside a function
    assert ("capplan.plan", "capplan.errors", ("_hidden",)) in edges  # a private name
    assert ("capplan.plan", "capplan.sub.x", ()) in edges  # importlib with a literal
    assert graph["capplan.sub.x"][1] == {"e": "capplan.errors"}  # alias for e._secret
    assert layer_of("capplan.errors")[0] < layer_of("capplan.plan")[0]
    assert layer_of("capplan.sub.x") is None  # an undeclared module is reported


@pytest.mark.parametrize("module, layer", [
    ("capplan", "shell"), ("capplan.importers.vllm", "study"), ("capplan.sim.truth", "simulation"),
    ("capplan.commands.envelope", "shell"), ("capplan.compare.gates", "analyses"),
])
def test_layer_lookup(module, layer):
    assert layer_of(module)[1] == layer
