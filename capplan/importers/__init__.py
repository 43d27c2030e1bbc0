"""Importers: turn the per-request output of the load-test tools people already use into a
study directory of the contract (``capplan import TOOL PATH... --out STUDY``).

Each tool module exposes ``parse(paths) -> list[RunData]`` (pure: reads files, no writes);
``import_paths`` picks the tool (``auto``: from the file contents), assembles the manifest and
events (``common.assemble``) and returns an ``ImportResult``; ``write_import`` writes it
atomically. See docs/importers.md for the field mapping per tool.
"""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import replace
from pathlib import Path

from ..errors import StudyError
from .common import ImportResult, assemble, looks_truncated, read_text, write_import

#: tool name → module under capplan.importers
TOOLS: dict[str, str] = {
    "guidellm": "guidellm",
    "vllm": "vllm",
    "aiperf": "aiperf",
    "inference-perf": "inference_perf",
    "genai-perf": "genai_perf",
    "sglang": "sglang",
    "llmperf": "llmperf",
}
ALIASES = {"inference_perf": "inference-perf", "genai_perf": "genai-perf"}


def _module(tool: str):
    return importlib.import_module(f"capplan.importers.{TOOLS[tool]}")


def canonical_tool(tool: str) -> str:
    t = ALIASES.get(tool.lower(), tool.lower())
    if t != "auto" and t not in TOOLS:
        raise StudyError(f"unknown tool {tool!r}", fix="one of: auto, " + ", ".join(TOOLS))
    return t


def _sniff_obj(obj) -> str | None:
    from . import genai_perf, guidellm, inference_perf, llmperf, vllm

    if guidellm.sniff(obj):
        return "guidellm"
    if vllm.sniff(obj):
        return "vllm"
    if genai_perf.sniff(obj):
        return "genai-perf"
    if inference_perf.sniff(obj):
        return "inference-perf"
    if llmperf.sniff(obj):
        return "llmperf"
    return None


def _sniff_file(path: Path) -> str | None:
    from . import aiperf, sglang

    name = path.name.removesuffix(".gz")
    if name == "profile_export.jsonl":
        return "aiperf"
    if name.startswith("per_request_lifecycle_metrics"):
        return "inference-perf"
    if name.endswith("_individual_responses.json"):
        return "llmperf"
    text = read_text(path)
    stripped = text.strip()
    if not stripped:
        raise StudyError("the file is empty; cannot detect which tool wrote it", file=str(path))
    if name.endswith(".jsonl") or (stripped.startswith("{") and "\n{" in stripped
                                   and not stripped.startswith("{\n")):
        first = stripped.splitlines()[0]
        try:
            obj = json.loads(first)
        except json.JSONDecodeError:
            obj = None
        if obj is not None:
            if aiperf.sniff_record(obj):
                return "aiperf"
            if sglang.sniff_line(obj):
                return "sglang"
    if name.endswith((".yaml", ".yml")):
        import yaml

        try:
            obj = yaml.safe_load(text)
        except yaml.YAMLError:
            return None
        return _sniff_obj(obj)
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.pos >= len(text.rstrip()) - 1 or looks_truncated(text):
            raise StudyError(f"truncated JSON at line {exc.lineno}, column {exc.colno}: the file "
                             "ends early, so the tool cannot be detected", file=str(path),
                             fix="re-export the file; a run killed mid-write leaves a truncated "
                                 "file") from None
        return None
    return _sniff_obj(obj)


def detect(path: str | os.PathLike) -> str:
    """The tool that wrote ``path`` (a result file or an output directory), from its contents."""
    p = Path(path)
    if not p.exists():
        raise StudyError("input path does not exist", file=str(p))
    if p.is_dir():
        rules = (("per_request_lifecycle_metrics.json*", "inference-perf"),
                 ("profile_export.jsonl*", "aiperf"),
                 ("profile_export.json*", "genai-perf"),
                 ("*_individual_responses.json*", "llmperf"))
        for pattern, tool in rules:
            if any(p.rglob(pattern)):
                return tool
        candidates = sorted(x for x in p.iterdir() if x.is_file() and x.name.endswith(
            (".json", ".jsonl", ".json.gz", ".yaml", ".yml")))
        for c in candidates:
            t = _sniff_file(c)
            if t:
                return t
        raise StudyError("no recognisable load-test output in this directory", file=str(p),
                         fix="pass a result file, or name the tool: capplan import "
                             "{" + ",".join(TOOLS) + "} PATH")
    tool = _sniff_file(p)
    if tool is None:
        raise StudyError("unrecognised file: not the output of any supported tool ("
                         + ", ".join(TOOLS) + ")", file=str(p),
                         fix="pass the tool's per-request export (see docs/importers.md) or name "
                             "the tool explicitly to see what is missing")
    return tool


def import_paths(tool: str, paths: list[str | os.PathLike], *, name: str | None = None,
                 system: dict | None = None, workload: dict | None = None) -> ImportResult:
    """Parse ``paths`` written by ``tool`` (or ``auto``) into a study (not yet written)."""
    if not paths:
        raise StudyError("no input paths given", fix="capplan import TOOL PATH... --out STUDY")
    tool = canonical_tool(tool)
    strs = [str(p) for p in paths]
    for p in strs:
        if not Path(p).exists():
            raise StudyError("input path does not exist", file=p)
    if tool == "auto":
        found = {p: detect(p) for p in strs}
        tools = sorted(set(found.values()))
        if len(tools) > 1:
            raise StudyError("the inputs come from different tools: " + ", ".join(
                f"{Path(p).name} → {t}" for p, t in found.items()),
                fix="import one tool's outputs per study")
        tool = tools[0]
    runs = _module(tool).parse(strs)
    label, how = study_name(strs, tool, name)
    res = assemble(tool, runs, name=label, system=system, workload=workload)
    return replace(res, notes=(*res.notes, f"study name {label!r} ({how})"))


#: folder and file names that say nothing about the study (the tools' defaults)


from .common import GENERIC_NAMES  # noqa: E402  (tool-default folder names)


def _stem(name: str) -> str:
    """A file name without its data extensions (``poisson_v2.json.gz`` → ``poisson_v2``)."""
    for ext in (".gz", ".json", ".jsonl", ".yaml", ".yml"):
        name = name.removesuffix(ext)
    return name


def study_name(paths: list[str], tool: str, name: str | None = None,
               today: str | None = None) -> tuple[str, str]:
    """(study name, where it came from): ``name`` when given; else the first input's name
    (extensions dropped) unless it is a tool default like ``artifacts`` or ``out``, in which case
    the nearest folder above with a telling name; else ``<tool>-<date>``."""
    if name:
        return name, "--name"
    p = Path(paths[0]).resolve()
    first = _stem(p.name) if p.is_file() else p.name
    for q in (p, *p.parents):
        label = first if q == p else q.name
        if label.lower() not in GENERIC_NAMES and not label.startswith("/"):
            if q == p:
                return label, "the input's name"
            return label, f"the folder above {first!r}, a generic name"
        if q.parent == q:
            break
    import datetime as _dt

    day = today or _dt.date.today().isoformat()
    return f"{tool}-{day}", "the tool and today's date: the input names are generic"


from .append import Appended, append_import, merge_into  # noqa: E402

__all__ = ["TOOLS", "ImportResult", "Appended", "detect", "import_paths", "write_import",
           "append_import", "merge_into", "canonical_tool", "study_name", "GENERIC_NAMES"]
