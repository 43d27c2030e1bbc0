"""The comparison export (I/O edge): compare.xlsx and one CSV per sheet, written atomically."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..errors import SpecError
from .result import Comparison


XLSX_NAME = "compare.xlsx"
CSV_NAMES = {"Comparison": "comparison.csv", "Buckets": "buckets.csv", "Fairness": "fairness.csv",
             "Workload": "workload.csv", "Verdict": "verdict.csv", "Provenance": "provenance.csv"}


def comparison_tables(cmp: Comparison, *, time: str, hashes: tuple[str, str] | None = None
                      ) -> dict[str, pd.DataFrame]:
    """The export's tables keyed by sheet name (numbers stay numbers)."""
    v = cmp.verdict
    verdict = pd.DataFrame(
        [("passed", str(v.passed))] + [("gate failed", f) for f in v.failed]
        + [("bucket regressed", f) for f in v.flagged_buckets] + [("note", n) for n in v.notes],
        columns=["item", "text"])
    from .. import __version__

    prov = [("capplan version", __version__), ("baseline", cmp.baseline_name),
            ("candidate", cmp.candidate_name), ("SLO", str(cmp.slo)),
            ("gates", cmp.gates.source), ("bootstrap", "paired" if cmp.paired else "independent"),
            ("replicates", cmp.reps), ("seed", cmp.seed),
            ("confidence (each family)", cmp.confidence_headline), ("time", time)]
    if hashes:
        prov += [("baseline content hash (sha256)", hashes[0]),
                 ("candidate content hash (sha256)", hashes[1])]
    return {"Comparison": cmp.to_frame(), "Buckets": cmp.buckets, "Fairness": cmp.fairness,
            "Workload": cmp.workload, "Verdict": verdict,
            "Provenance": pd.DataFrame(prov, columns=["key", "value"])}


def check_out_dir(out_dir) -> Path:
    """An --out directory may be new, empty, or an earlier compare export; anything else is a
    SpecError (nothing of the user's is replaced)."""
    out = Path(out_dir)
    if out.exists():
        if not out.is_dir():
            raise SpecError("--out exists and is not a directory", field="--out", file=str(out),
                            fix="choose a new directory name for the comparison export")
        if any(out.iterdir()) and not (out / XLSX_NAME).is_file():
            raise SpecError("--out directory exists and holds other files; the export would "
                            "replace it", field="--out", file=str(out),
                            fix="choose a new or empty directory")
    return out


def export_comparison(cmp: Comparison, out_dir, *, time: str | None = None,
                      hashes: tuple[str, str] | None = None) -> Path:
    """Write compare.xlsx and one CSV per sheet, built in a temp directory and renamed (never
    half-written). Text cells are formula-injection safe (capplan.export writers)."""
    import datetime as _dt

    from ..export import write_csv, write_xlsx
    from ..io import atomic_dir

    out = check_out_dir(out_dir)
    time = time or _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
    created = _dt.datetime.fromisoformat(time).astimezone(_dt.timezone.utc).replace(tzinfo=None)
    tables = comparison_tables(cmp, time=time, hashes=hashes)
    with atomic_dir(out) as tmp:
        write_xlsx(tables, tmp / XLSX_NAME, created=created, title="capplan comparison")
        for sheet, df in tables.items():
            write_csv(df, tmp / CSV_NAMES[sheet])
    return out
