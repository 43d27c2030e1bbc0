"""`capplan import TOOL PATH... --out STUDY | --into STUDY`: turn a load-test tool's per-request
output into a study directory, or append it to one (see docs/importers.md). A thin shell over
``capplan.importers.import_paths`` / ``write_import`` / ``append_import``. Bad input exits 2 with a
message naming the file."""

from __future__ import annotations

import click

from ..contract import CACHE_CONDITIONS
from ..errors import SpecError
from ..importers import TOOLS, append_import, import_paths, write_import
from ..importers.common import check_study_out


@click.command("import", help="Import load-test output (GuideLLM, vLLM bench serve, AIPerf, "
               "inference-perf, GenAI-Perf, SGLang, LLMPerf) into a study directory (--out) or "
               "append it to an existing study (--into). TOOL is one of: auto, "
               + ", ".join(TOOLS) + ". PATH is a result file or the tool's output directory; "
               "several PATHs allowed (e.g. one vLLM JSON per rate).")
@click.argument("tool")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("--out", "out", default=None, type=click.Path(), help="study directory to write")
@click.option("--into", "into", default=None, type=click.Path(),
              help="existing study to append the new runs to (atomically; refused when the new "
                   "runs offer a different workload)")
@click.option("--allow-workload-change", is_flag=True, default=False,
              help="with --into: append runs whose offered workload differs, with a warning")
@click.option("--name", default=None, help="study name (default: the --out folder's name when "
              "several inputs are given; else the first input's name, or the folder above a generic "
              "one such as artifacts/ or out/, else the tool and date)")
@click.option("--cache-condition", default=None, type=click.Choice(CACHE_CONDITIONS),
              help="label every run with the prefix-cache state it was measured in (compare refuses to "
                   "put runs of different states side by side)")
def cmd(tool: str, paths: tuple[str, ...], out: str | None, into: str | None, name: str | None,
        cache_condition: str | None = None, allow_workload_change: bool = False) -> int:
    if (out is None) == (into is None):
        raise SpecError("give exactly one of --out STUDY (a new study) and --into STUDY (append "
                        "to an existing one)", field="--out/--into",
                        fix="capplan import TOOL PATH... --out STUDY, or ... --into STUDY")
    if allow_workload_change and into is None:
        raise SpecError("--allow-workload-change only applies to --into", field="--allow-workload-change")
    if out is not None:
        check_study_out(out, list(paths))  # before parsing: a bad --out fails fast
    if name is None and out is not None and len(paths) > 1:
        # several runs' folders: the study is what --out names, not the first run
        from pathlib import Path

        from ..importers import GENERIC_NAMES

        stem = Path(out).expanduser().resolve().name
        if stem.lower() not in GENERIC_NAMES:
            name = stem
    result = import_paths(tool, list(paths), name=name)
    if cache_condition is not None:
        for r in result.manifest["runs"]:
            r["cache_condition"] = cache_condition
    renamed: dict = {}
    if into is not None:
        appended = append_import(result, into, allow_workload_change=allow_workload_change)
        warnings, renamed, dest = appended.warnings, appended.renamed, into
    else:
        warnings, dest = result.warnings, out
        write_import(result, out)
    for w in warnings:
        click.echo(f"WARNING: {w}", err=True)
    counts = result.status_counts()
    m = result.manifest
    verb = "appended" if into is not None else "imported"
    click.echo(f"{verb} {result.events.num_rows} requests from {result.tool} into {dest} "
               f"({m['load_model']} loop, {len(m['runs'])} runs)")
    if into is None:
        for note in result.notes:
            click.echo(f"  {note}")
    for r in m["runs"]:
        if "offered_rps" in r:
            level = f"offered {r['offered_rps']:.3g} rps"
            if r.get("offered_rps_from"):
                level += f" (from {r['offered_rps_from']})"
            elif r.get("measured_rps") is not None:
                level += f" (nominal {r['nominal_rps']:g}, measured {r['measured_rps']:.3g})"
        else:
            level = f"concurrency {r['concurrency']}"
        st = ", ".join(f"{k} {v}" for k, v in sorted(counts.get(r["run_id"], {}).items()))
        added = result.added.get(r["run_id"]) or {}
        extra = "".join(f"; {n} {s} row(s) added (counted by the tool, not exported)"
                        for s, n in sorted(added.items()))
        rid = renamed.get(r["run_id"], r["run_id"])
        click.echo(f"  {rid}: {level}; {st}{extra}")
    return 0
