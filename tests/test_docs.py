"""The project documents itself: docs/statistics.md has the sections code cites, every
`docs/….md#anchor` citation points at a real section, and no project file cites design notes
outside the repository (only tests may read the public traces beside the checkout)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
TEXT_SUFFIXES = {".py", ".md", ".ipynb", ".yaml", ".yml", ".toml", ".txt", ".j2", ".cfg", ".sh",
                 ".json"}
PLACES = ("capplan", "docs", "notebooks", "templates", "benchmarks", "scripts", "tests")

#: the anchors other modules and pages cite (docs/statistics.md#<anchor>)
STATISTICS_ANCHORS = ("block-bootstrap", "block-length", "log-bucket-histograms",
                      "the-cslo-interval", "sample-size-rules", "degenerate-runs",
                      "what-a-within-run-bootstrap-cannot-see", "diagnostics")

OUTSIDE = re.compile(r"\.\./shared|/work/shared|shared/design|shared/data|STATISTICS\.md|"
                     r"ARCHITECTURE\.md|TOOLING\.md|STYLE\.md|PEERS\.md")
#: Modules still allowed to cite notes outside the repository (none left)
NOT_YET: set[str] = set()


def project_files():
    files = [ROOT / "README.md", ROOT / "pyproject.toml"]
    for place in PLACES:
        files += [p for p in (ROOT / place).rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES]
    return sorted(set(files))


def anchors(md: Path) -> set[str]:
    """GitHub-style heading slugs plus explicit <a id="…"> anchors of a markdown file."""
    text = md.read_text(encoding="utf-8")
    out = set(re.findall(r'<a id="([^"]+)"', text))
    for h in re.findall(r"^#{1,6} +(.+?) *$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", h.lower().replace("`", "")).replace(" ", "-")
        out.add(slug)
    return out


def test_statistics_page_has_every_cited_section():
    have = anchors(DOCS / "statistics.md")
    missing = [a for a in STATISTICS_ANCHORS if a not in have]
    assert not missing, f"docs/statistics.md lacks sections: {missing}"


def test_every_docs_anchor_citation_exists():
    cite = re.compile(r"(?:docs/)?([a-z][a-z0-9_-]*\.md)#([a-z0-9_-]+)")
    bad = []
    for f in project_files():
        rel = f.relative_to(ROOT)
        text = f.read_text(encoding="utf-8", errors="replace")
        for i, line in enumerate(text.splitlines(), 1):
            for page, anchor in cite.findall(line):
                md = DOCS / page
                if page.isupper() or not md.is_file():
                    continue  # not a page of docs/ (other checks cover outside citations)
                if anchor not in anchors(md):
                    bad.append(f"{rel}:{i}: {page}#{anchor}")
    assert not bad, "citations of sections that do not exist:\n" + "\n".join(bad)


def test_no_project_file_cites_notes_outside_the_repository():
    bad = []
    for f in project_files():
        rel = str(f.relative_to(ROOT))
        if rel in NOT_YET or f == Path(__file__).resolve():
            continue
        for i, line in enumerate(f.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if rel.startswith("tests/") and rel.endswith(".py"):  # the public traces: allowed
                line = re.sub(r"(\.\./)?shared/data/traces", "", line)
            if OUTSIDE.search(line):
                bad.append(f"{rel}:{i}: {line.strip()[:120]}")
    assert not bad, ("project files must cite docs/ of the project, not notes outside it:\n"
                     + "\n".join(bad))


@pytest.mark.parametrize("page", ["statistics.md", "architecture.md"])
def test_new_pages_link_only_to_existing_pages(page):
    text = (DOCS / page).read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([a-z0-9_-]+\.md)(?:#[^)]*)?\)", text):
        assert (DOCS / target).is_file(), f"docs/{page} links to missing docs/{target}"
