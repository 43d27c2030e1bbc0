"""Every term a report page uses has a glossary entry, and no page sends its reader to a file
of the repository (docs/*.md): the report explains itself through its glossary and its own
pages. Reads the rendered demo report and the comparison report (shared session fixtures of
test_report) and the text cells of every report notebook (the twin, timelines and
serving-policies pages, which those reports do not render)."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from bs4 import BeautifulSoup

from capplan import report as R
from capplan.glossary import TERMS
from test_report import compare_report, demo_report, small_sweeps  # noqa: F401  (shared fixtures)

#: The project's jargon: terms report pages use that a capacity planner cannot be assumed to
#: know. Built from the pages' own text (the test below fails for a term no page uses, so the
#: list cannot drift from the pages).
JARGON = (
    "C_SLO", "SLO", "TTFT", "TPOT", "ITL", "E2E", "p99", "N_eff", "design effect", "goodput",
    "throughput", "attainment", "offered rate", "lower bound", "confidence interval",
    "block-bootstrap", "isotonic", "bracketed", "knee", "warm-up", "MSER-5", "Little's law",
    "generator lag", "replica group", "peak demand", "λ_peak", "planned demand",
    "failure reserve", "rollout overlap", "cold-start reserve", "warm floor", "billed GPUs",
    "utilisation", "operating point", "PUE", "sensitivity band", "steady window",
    "capacity per replica group", "SLO-meeting",
    # issue 28: missing from the glossary until then
    "honest", "unsupported", "τ", "logit", "prior", "Clopper–Pearson", "load effect", "SLO-minutes",
    # and what the twin, mix, timelines and comparison pages add
    "KV", "SD", "CV", "twin", "prediction band", "target mix", "tested mix",
    "reweighting", "SLO class", "gate", "good requests lost",
)
#: Capitals and symbols that are plain words or are defined where they stand.
PLAIN = {
    "GPU", "GPUs", "USD", "CSV", "CSVs", "JSON", "XLSX", "HTML", "ISO", "UTC", "IT",  # IT power: in PUE
    "FAIL", "PASS", "NO", "VERDICT", "AGREES", "DISAGREES", "OK", "CPU", "ID", "LLM", "A4", "URL",
    "Σ", "λ",  # sums and rates in formulas
    # the plan's line items: each symbol is the label of the row that computes it
    "R_traffic", "N_failure", "N_rollout", "N_cold",
}
DOCS_REF = re.compile(r"(?<![\w/])docs/[\w./-]+\.md|(?<![\w/.])[\w-]+\.md\b(?!\w)")
#: the report's own file a page may name (it is in the report folder)
OWN_FILES = {"reproduce.md"}


def _visible(html_text: str) -> str:
    soup = BeautifulSoup(html_text, "html.parser")
    for tag in soup(["script", "style", "code", "head"]):  # <pre> is printed output: kept
        tag.decompose()
    return soup.get_text(" ")


def _notebook_text(path: Path) -> str:
    """The words a notebook's page shows of its own: markdown cells and the literal strings
    its code displays (code spans dropped: they are commands, not prose)."""
    nb = nbformat.read(str(path), as_version=4)
    parts = []
    for c in nb.cells:
        if c.cell_type == "markdown":
            parts.append(re.sub(r"`[^`]*`", " ", c.source))
        elif "parameters" not in c.metadata.get("tags", []):
            for s in re.findall(r'Markdown\(\s*f?"((?:[^"\\]|\\.)*)"', c.source):
                parts.append(re.sub(r"`[^`]*`", " ", s))
    return "\n".join(parts)


def _pages(demo_report, compare_report) -> dict[str, str]:  # noqa: F811
    pages = {f"demo/{p.name}": _visible(p.read_text(encoding="utf-8"))
             for p in sorted(demo_report.glob("*.html")) if p.name != "glossary.html"}
    pages |= {f"compare/{p.name}": _visible(p.read_text(encoding="utf-8"))
              for p in sorted(compare_report["dir"].glob("*.html")) if p.name != "glossary.html"}
    pages |= {f"notebook/{p.name}": _notebook_text(p) for p in sorted(R.notebooks_dir().glob("*.ipynb"))
              if p.name != R.WHATIF_NOTEBOOK}
    return pages


def _uses(text: str, term: str) -> bool:
    return re.search(rf"(?<![\w\-]){re.escape(term)}(?!\w)", text) is not None


def _has_entry(term: str) -> bool:
    return any(term in t.phrases for t in TERMS)


@pytest.fixture(scope="module")
def pages(demo_report, compare_report):  # noqa: F811
    return _pages(demo_report, compare_report)


def test_every_jargon_term_a_page_uses_has_a_glossary_entry(pages):
    used = {term: [name for name, text in pages.items() if _uses(text, term)] for term in JARGON}
    assert not [t for t, where in used.items() if not where], "jargon no page uses: drop it"
    missing = {t: where[:3] for t, where in used.items() if not _has_entry(t)}
    assert not missing, missing


def test_every_abbreviation_and_symbol_on_a_page_is_in_the_glossary(pages):
    """Capitals (SLO, KV, SD), symbols (τ, λ_peak) and Name_names (C_SLO, N_eff) are found
    automatically, so a new one on a page fails here until the glossary defines it."""
    token = re.compile(r"(?<![\w\-/.])(?:[A-Z][A-Z0-9]{1,5}s?|[A-Z]_[A-Za-z]+|[α-ωΑ-Ω](?:_\w+)?)(?![\w\-])")
    found: dict[str, set[str]] = {}
    for name, text in pages.items():
        for m in token.findall(text):
            found.setdefault(m, set()).add(name)
    assert {"SLO", "TTFT", "C_SLO", "τ"} <= set(found)  # the scan sees what pages say
    unknown = {t: sorted(w)[:3] for t, w in found.items()
               if t not in PLAIN and not _has_entry(t) and not _has_entry(t.rstrip("s"))}
    assert not unknown, unknown


def test_the_issue_28_terms_are_defined():
    names = " ".join(t.name + " " + t.definition for t in TERMS)
    for word in ("honest", "τ", "logit", "prior", "Clopper–Pearson", "load effect", "SLO-minutes"):
        assert word in names, word


def test_no_page_sends_readers_to_repository_files(pages):
    """The report explains itself (glossary, its own pages): no page names docs/*.md or any
    other .md file the report folder does not hold."""
    bad = {}
    for name, text in pages.items():
        refs = [m.group(0) for m in DOCS_REF.finditer(text) if m.group(0) not in OWN_FILES]
        if refs:
            bad[name] = refs
    assert not bad, bad
    # what the reader can follow instead is there
    for report in ("demo",):
        assert any(name.startswith(report) and "glossary" in text.lower() for name, text in pages.items())
