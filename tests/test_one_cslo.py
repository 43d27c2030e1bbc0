"""One measured C_SLO (issue 28): every C_SLO that the demo study's report pages, the CLI
commands, the what-if and the notebooks print is either *the measured C_SLO* — the estimate,
interval and lower bound `capplan envelope` prints, to the digits shown — or a number labelled
as another quantity in words that say why it differs (``OTHER``); and each other quantity has
one value wherever it is printed. The rule is docs/envelope.md, "One measured C_SLO".

Sources: `capplan envelope`, `mix`, `plan`, `design`, `twin check`; the what-if's first
numbers (its model, no browser); the report's index, envelope, plan and mix pages (the demo
report rendered once per session, tests/test_report.py); notebook 06-twin executed here on a
fitted twin (replays and the steady state cut for time: neither changes a measured number)."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
from bs4 import BeautifulSoup

from capplan import report as R
from capplan.cli import main
from test_report import demo_report  # noqa: F401  (shared fixture)

pytestmark = pytest.mark.slow  # executes a notebook and five commands (≈ 2 min beside the shared report)

#: words that label a printed C_SLO as another quantity than the measured C_SLO, with why it is
#: another number; the first that a label contains names its kind. Anything else printed as a
#: C_SLO claims to be the measured one.
OTHER = {
    "twin": "simulated on the twin (its replays of the measured runs, or its long steady-state runs)",
    "target mix": "production's mix: each cell's tested attainment reweighted to the target's shares",
    "within-run": "each measured run read on its own, without the run-to-run variation (what a replay gives)",
    "band": "the sensitivity band: the C_SLOs over which the plan keeps its groups",
    "every slo class": "every SLO class meeting its own SLO",
}
FIELDS = ("estimate", "ci_low", "ci_high", "lower_bound")
REPLICAS = 2  # the demo study's replicas (checked in the test): a group's capacity is C_SLO ÷ 2
NUM = r"(\d+(?:\.\d+)?)"


@dataclass(frozen=True)
class Printed:
    """One C_SLO as printed: where, its label, and its numbers as text (× ``scale`` for a
    number printed per replica group)."""

    source: str
    label: str
    estimate: str | None = None
    ci_low: str | None = None
    ci_high: str | None = None
    lower_bound: str | None = None
    scale: int = 1
    value: str | None = None  # a number printed as C_SLO without saying which: must be one of the four

    @property
    def kind(self) -> str:
        low = self.label.lower()
        return next((k for k in OTHER if k in low), "measured")

    @property
    def quantity(self) -> tuple[str, str]:
        """The kind, split where one kind holds two quantities (the twin's replays and its
        steady state)."""
        low = self.label.lower()
        return self.kind, "replay" if "replay" in low else "steady" if "steady" in low else ""

    def values(self):
        for f in FIELDS + ("value",):
            v = getattr(self, f)
            if v is not None:
                yield f, float(v) * self.scale, _tol(v) * self.scale


def _tol(text: str) -> float:
    """Half a unit of the last digit shown."""
    dec = len(text.split(".")[1]) if "." in text else 0
    return 0.5 * 10.0 ** -dec + 1e-9


# ------------------------------------------------------------------------------ parsing


def _cli_envelope_lines(text: str, source: str, label: str) -> list[Printed]:
    """The lines of ``Envelope.to_text``: estimate, interval, lower bound."""
    est = re.search(rf"C_SLO estimate:\s+{NUM} req/s", text)
    ci = re.search(rf"\d+% CI:\s+\[{NUM}, {NUM}\] req/s", text)
    lb = re.search(rf"lower bound \(\d+%, one-sided\): {NUM} req/s", text)
    assert est and ci and lb, f"{source}: no envelope lines in\n{text[:2000]}"
    return [Printed(source, label, est.group(1), ci.group(1), ci.group(2), lb.group(1))]


def _mix_lines(text: str, source: str) -> list[Printed]:
    out = [Printed(source, f"C_SLO at the {m.group(1)} mix" + (m.group(7) or ""), m.group(2), m.group(3),
                   m.group(4), m.group(5))
           for m in re.finditer(rf"C_SLO at the (tested|target) mix:\s+{NUM} req/s\s+\d+% CI \[{NUM}, {NUM}\]"
                                rf"\s+lower bound {NUM}\s+\(([^;)]*)(;[^\n]*)?", text)]
    assert {p.label.split()[3] for p in out} == {"tested", "target"}, f"{source}: {text[:2000]}"
    return out


def _plan_words(text: str, source: str) -> list[Printed]:
    """The plan's sentences: the capacity per group (the lower bound ÷ replicas), production's
    mix against the tested mix, the operating point of the KV check, the sensitivity band."""
    out = []
    for m in re.finditer(rf"{NUM} req/s per (?:replica )?group \(study C_SLO lower bound ÷ (\d+) replicas\)", text):
        out.append(Printed(source, "study C_SLO lower bound ÷ replicas", lower_bound=m.group(1),
                           scale=int(m.group(2))))
    for m in re.finditer(rf"\((target mix \([^)]*\)) {NUM} against {NUM} req/s per group\)", text):
        out.append(Printed(source, m.group(1), lower_bound=m.group(2), scale=REPLICAS))
        out.append(Printed(source, "tested mix, per group", lower_bound=m.group(3), scale=REPLICAS))
    for m in re.finditer(rf"interpolated between tested levels {NUM} and {NUM} req/s at {NUM} req/s", text):
        out.append(Printed(source, "operating point of the study facts (the C_SLO lower bound)",
                           lower_bound=m.group(3)))
    for m in re.finditer(rf"serving C_SLO {NUM} req/s per replica", text):
        out.append(Printed(source, "the C_SLO lower bound per replica (KV check)", lower_bound=m.group(1),
                           scale=REPLICAS))
    for m in re.finditer(rf"\bC_SLO = {NUM}(?! req/s)", text):  # a formula's input named C_SLO
        out.append(Printed(source, "C_SLO (a formula's input)", value=m.group(1)))
    for m in re.finditer(rf"It plans on the lower bound {NUM} req/s", text):
        out.append(Printed(source, "the lower bound the plan plans on", lower_bound=m.group(1)))
    for m in re.finditer(rf"stays the same for any C_SLO from {NUM} to {NUM} req/s", text):
        out.append(Printed(source, "sensitivity band", ci_low=m.group(1), ci_high=m.group(2)))
    return out


def _squash(text: str) -> str:
    """One space between words, none before punctuation (HTML splits text at tags)."""
    return re.sub(r"\( ", "(", re.sub(r" ([;:,)])", r"\1", re.sub(r"\s+", " ", text)))


def _html_text(html: str) -> str:
    return _squash(BeautifulSoup(html, "html.parser").get_text(" "))


def _tables(html: str, source: str) -> list[Printed]:
    """Every table with an estimate column: one C_SLO per row, its first text cell the label."""
    out = []
    for table in BeautifulSoup(html, "html.parser").find_all("table"):
        rows = table.find_all("tr")
        if not rows:
            continue
        head = [c.get_text(" ", strip=True).lower() for c in rows[0].find_all(["th", "td"])]
        if not any("estimate" in h for h in head):
            continue
        col = {"estimate": next(i for i, h in enumerate(head) if "estimate" in h),
               "ci_low": next((i for i, h in enumerate(head) if h.endswith("low")), None),
               "ci_high": next((i for i, h in enumerate(head) if h.endswith("high")), None),
               "lower_bound": next((i for i, h in enumerate(head) if "lower bound" in h), None)}
        for r in rows[1:]:
            cells = [c.get_text(" ", strip=True) for c in r.find_all(["th", "td"])]
            if len(cells) != len(head):
                continue
            label = next(c for c in cells if not re.fullmatch(r"[\d.,]*", c))
            vals = {f: (cells[i] if i is not None and re.fullmatch(r"\d+\.\d+", cells[i]) else None)
                    for f, i in col.items()}
            if vals["estimate"] is not None:
                out.append(Printed(source, label, **vals))
    return out


def _index(html: str, source: str) -> list[Printed]:
    soup = BeautifulSoup(html, "html.parser")
    cap = _squash(soup.find(id="capacity-interval").get_text(" "))
    m = re.search(rf"estimate {NUM} req/s; \d+% confidence interval {NUM} req/s to {NUM} req/s; lower bound "
                  rf"{NUM} req/s", cap)
    assert m, cap
    out = [Printed(source, "C_SLO of the tested system", *m.groups())]
    assumes = _squash(soup.find(id="plan-assumes").get_text(" "))
    m = re.search(rf"lower bound: {NUM} req/s ÷", assumes)
    assert m, assumes
    out.append(Printed(source, "the C_SLO the plan uses", lower_bound=m.group(1)))
    return out + _plan_words(_html_text(html), source)


def _envelope_page(html: str, source: str) -> list[Printed]:
    text = _html_text(html)
    m = re.search(rf"C_SLO = {NUM} req/s \(\d+% CI {NUM} – {NUM}\); plan on the lower bound {NUM} req/s", text)
    assert m, text[:3000]
    return [Printed(source, "C_SLO (headline)", *m.groups())] + _cli_envelope_lines(text, source, "C_SLO (text)")


def _plan_page(html: str, source: str) -> list[Printed]:
    rows = {}
    for tr in BeautifulSoup(html, "html.parser").find_all("tr"):
        cells = [c.get_text(" ", strip=True) for c in tr.find_all(["th", "td"])]
        if len(cells) >= 2 and cells[0].startswith("C_SLO") and "(study system)" in cells[0]:
            rows[cells[0]] = cells[1]
    pick = {f: next((v for k, v in rows.items() if w in k), None)
            for f, w in (("estimate", "estimate"), ("ci_low", "low end"), ("ci_high", "high end"),
                         ("lower_bound", "lower bound"))}
    assert all(pick.values()), rows
    return [Printed(source, "C_SLO (study system), capacity table", **pick)] + _plan_words(_html_text(html), source)


def _mix_page(html: str, source: str) -> list[Printed]:
    text = _html_text(html)
    out = _tables(html, source) + _plan_words(text, source)
    for m in re.finditer(rf"Target mix \(([^)]*)\): C_SLO {NUM} req/s, lower bound {NUM}(?: \([^)]*\))? "
                         rf"\(tested mix {NUM}, lower bound {NUM}\)", text):
        out.append(Printed(source, f"target mix ({m.group(1)}), headline", m.group(2), lower_bound=m.group(3)))
        out.append(Printed(source, "tested mix, headline", m.group(4), lower_bound=m.group(5)))
    assert any(p.label.startswith("tested mix, headline") for p in out), text[:3000]
    return out


def _notebook_html(nb) -> str:
    return "\n".join(out.get("data", {}).get("text/html", "") + "<pre>" + out.get("data", {}).get(
        "text/markdown", "") + out.get("text", "") + "</pre>" for cell in nb.cells for out in cell.get("outputs", []))


# ------------------------------------------------------------------------------ the test


def _run(capsys, *argv) -> str:
    rc = main([str(a) for a in argv])
    out = capsys.readouterr().out
    assert rc == 0, out
    return out


def test_one_measured_cslo_everywhere(demo_report, tmp_path, capsys):  # noqa: F811
    from capplan.envelope import fit_envelope
    from capplan.plan.spec import load_plan_spec
    from capplan.study import open_study
    from capplan.twin import fit_twin, write_twin
    from capplan.whatif import WhatIfModel, whatif_state

    study, spec = R.demo_study_path(), R.default_spec_path()
    slo = str(load_plan_spec(spec).slo)
    ref = fit_envelope(study, slo).cslo  # the measured C_SLO: capplan.fit_envelope's defaults
    assert open_study(study).manifest.replicas == REPLICAS
    twin = tmp_path / "twin.yaml"
    write_twin(fit_twin(study, reps=30), twin)

    printed: list[Printed] = []
    with ThreadPoolExecutor(max_workers=1) as pool:
        nb06 = pool.submit(R.execute_notebook, R.notebooks_dir() / "06-twin.ipynb",
                           {"study_path": str(study), "twin_path": str(twin), "replays": 2, "steady": False},
                           cwd=tmp_path)
        printed += _cli_envelope_lines(_run(capsys, "envelope", study, "--slo", slo), "capplan envelope",
                                       "C_SLO")
        printed += _mix_lines(_run(capsys, "mix", study, "--slo", slo, "--target",
                                   R.templates_dir() / "mix-demo.csv"), "capplan mix")
        printed += _plan_words(_run(capsys, "plan", study, "--spec", spec, "--out", tmp_path / "plan"),
                               "capplan plan")
        out = _run(capsys, "design", study, "--slo", slo, "--sims", "1", "--budget-minutes", "10",
                   "--out", tmp_path / "design.yaml")
        m = re.search(rf"now:\s+estimate {NUM}, lower bound {NUM} req/s", out)
        assert m, out
        printed.append(Printed("capplan design", "now", m.group(1), lower_bound=m.group(2)))
        out = _run(capsys, "twin", "check", study, "--twin", twin, "--slo", slo, "--replays", "2", "--no-steady")
        rows = re.findall(rf"^(.+?)\s{{2,}}{NUM} req/s\s+95 % interval \[{NUM}, {NUM}\](?:, lower bound {NUM})?",
                          out, re.M)
        assert len(rows) >= 3, out
        printed += [Printed("capplan twin check", r[0].strip(), r[1], r[2], r[3], r[4] or None) for r in rows]
        model = WhatIfModel.build()
        shown = whatif_state(model, model.defaults()).table.set_index("key")["shown"]
        printed.append(Printed("what-if", "C_SLO (tested system)", shown["cslo_estimate"],
                               lower_bound=shown["cslo_lower_bound"]))
        printed += _tables(_notebook_html(nb06.result()), "notebook 06-twin")
    for page, parse in (("index.html", _index), ("02-envelope.html", _envelope_page),
                        ("03-plan.html", _plan_page), ("07-mix.html", _mix_page)):
        printed += parse((demo_report / page).read_text(encoding="utf-8"), f"report {page}")

    # the measured C_SLO: one value per field, capplan envelope's, to the digits shown
    want = {f: getattr(ref, f) for f in FIELDS}
    bad = [f"{p.source} · {p.label} · {f} {v:g} (capplan envelope: "
           + (f"{want[f]:.4f})" if f in want else ", ".join(f"{x:.4f}" for x in want.values()) + ")")
           for p in printed if p.kind == "measured" for f, v, tol in p.values()
           if all(abs(v - want[g]) > tol for g in ([f] if f in want else FIELDS))]
    assert not bad, "numbers printed as the measured C_SLO that are not it:\n" + "\n".join(bad)

    # every source printed it, and the other quantities were found where they are printed
    sources = {p.source for p in printed}
    assert {p.source for p in printed if p.kind == "measured"} == sources
    assert {("twin", "replay"), ("target mix", ""), ("within-run", ""), ("band", "")} <= {p.quantity for p in printed}

    # every other quantity: one value wherever it is printed (to the digits shown)
    by: dict[tuple, list] = {}
    for p in printed:
        if p.kind != "measured":
            for f, v, tol in p.values():
                by.setdefault((*p.quantity, f), []).append((v, tol, f"{p.source} · {p.label}"))
    bad = [f"{key}: {a} against {b}" for key, vals in by.items() for i, a in enumerate(vals) for b in vals[i + 1:]
           if abs(a[0] - b[0]) > a[1] + b[1]]
    assert not bad, "another quantity printed with two values:\n" + "\n".join(bad)
