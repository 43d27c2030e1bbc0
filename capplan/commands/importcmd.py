"""`capplan import TOOL PATH... --out STUDY`: turn a load-test tool's per-request output into a
study directory (see docs/importers.md). Bad input exits 2 with a message naming the file."""

from __future__ import annotations

import click

from ..contract import CACHE_CONDITIONS
from ..importers import TOOLS, import_paths, write_import
from ..importers.common import check_out


@click.command("import", help="Import load-test output (GuideLLM, vLLM bench serve, AIPerf, "
               "inference-perf, GenAI-Perf, SGLang, LLMPerf) into a study directory. TOOL is one "
               "of: auto, " + ", ".join(TOOLS) + ". PATH is a result file or the tool's output "
               "directory; several PATHs allowed (e.g. one vLLM JSON per rate).")
@click.argument("tool")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("--out", "out", required=True, type=click.Path(), help="study directory to write")
@click.option("--name", default=None, help="study name (default: the first input's name)")
@click.option("--cache-condition", default=None, type=click.Choice(CACHE_CONDITIONS),
              help="label every run with the prefix-cache state it was measured in (compare refuses to "
                   "put runs of different states side by side)")
def cmd(tool: str, paths: tuple[str, ...], out: str, name: str | None, cache_condition: str | None = None) -> int:
    check_out(out, list(paths))  # before parsing: a bad --out fails fast
    result = import_paths(tool, list(paths), name=name)
    if cache_condition is not None:
        for r in result.manifest["runs"]:
            r["cache_condition"] = cache_condition
    for w in result.warnings:
        click.echo(f"WARNING: {w}", err=True)
    write_import(result, out)
    counts = result.status_counts()
    m = result.manifest
    click.echo(f"imported {result.events.num_rows} requests from {result.tool} into {out} "
               f"({m['load_model']} loop, {len(m['runs'])} runs)")
    for r in m["runs"]:
        level = (f"offered {r['offered_rps']:.3g} rps" if "offered_rps" in r
                 else f"concurrency {r['concurrency']}")
        nominal = f" (nominal {r['nominal_rps']:g})" if r.get("nominal_rps") is not None else ""
        st = ", ".join(f"{k} {v}" for k, v in sorted(counts.get(r["run_id"], {}).items()))
        click.echo(f"  {r['run_id']}: {level}{nominal}; {st}")
    return 0
