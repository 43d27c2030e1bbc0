"""SGLang ``bench_serving --output-file X.jsonl --output-details``: one JSON line per benchmark
run, with vLLM-style index-aligned arrays (``input_lens``, ``output_lens``, ``ttfts``, ``itls``,
``errors``) but no per-request send times.

Arrival order and times are lost, so only an iid analysis is valid: each run is marked
``timestamps: none`` (also at the top of study.yaml) with ``arrival: unknown``, and its
``scheduled_ns`` are synthetic, spread evenly at the nominal rate in file order
(``scheduled_ns_synthetic: true``). Per-request TTFT/ITL/E2E are exact relative to them.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import StudyError
from .common import RunData, load_jsonl
from .vllm import parse_result

TOOL = "sglang"
EXPECTED = "SGLang bench_serving results (JSONL, one run per line, written with " \
           "--output-details: 'input_lens', 'output_lens', 'ttfts', 'itls', 'errors')"


def sniff_line(obj) -> bool:
    return isinstance(obj, dict) and "ttfts" in obj and "itls" in obj and \
        "start_times" not in obj and ("backend" in obj or "request_rate" in obj)


def parse(paths: list[str]) -> list[RunData]:
    runs = []
    for p in paths:
        pp = Path(p)
        files = sorted(pp.glob("*.jsonl")) if pp.is_dir() else [pp]
        if not files:
            raise StudyError(f"no .jsonl files found; expected {EXPECTED}", file=str(pp))
        for f in files:
            for i, obj in enumerate(load_jsonl(f, EXPECTED), 1):
                run = parse_result(obj, f, expected=EXPECTED, where=f"line {i}: ")
                run.timestamps = "none"
                run.arrival = "unknown"
                run.extra["scheduled_ns_synthetic"] = True
                runs.append(run)
    return runs
