"""`capplan compare` against synthetic truths, and its speed before/after (issue 14).

The protocol (capplan.sim, the ``demo`` preset on ONE replica, no ITL lists or power):
8 Poisson rates 0.5 … 4.5 req/s from light load into overload (capacity under the SLO ≈
2.7 req/s, throughput saturates near 3.5), 300-s runs with a 30-s warm-up, SLO
ttft_ms=2000,tpot_ms=100,attainment=0.99. For pair k (seeds S = --seed0 + 2k):

- **null**: baseline seed S vs the same system with seed S + 1 (another trace, unpaired). The
  truth is "no change": the comparison must be made (not refused) and every gate must pass.
- **detection**: baseline seed S vs the same trace (seed S) on a replica whose decode steps are
  30 % slower. The truth is a regression: it must fail (exit 1, never refused with exit 2), and
  long answers — which now time out — must be named: a ``max_output_tokens`` bucket starting at
  ≥ 256 tokens flagged on its failure rate.

Each rate comes with its Clopper–Pearson 95 % interval. With ``--old-ref`` (default ``main``)
the same pairs also go through the comparison of that git revision (unpacked once under
benchmarks/_data/, run in child processes) for the before/after figures. ``--timing`` times
``capplan compare`` end to end (CLI, child processes, best of ``--timing-repeats``) on two
demo-size studies (the ``demo`` preset: 13 rates × 600 s, 2 replicas, ITL lists and power),
old and new in one run: the same study against a copy of itself (both versions compute every
row) and two seeds (the old version may refuse that pair).

    python benchmarks/compare_synth.py --pairs 40 --jobs 2
    python benchmarks/compare_synth.py --pairs 4 --jobs 2 --no-old          # quick look
    python benchmarks/compare_synth.py --pairs 0 --timing                   # speed only
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DATA = HERE / "_data"
SLO_TEXT = "ttft_ms=2000,tpot_ms=100,attainment=0.99"
RATES = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.5)
SLOWDOWN = 1.3
LONG_ANSWER = 256

# The old comparison in a child process: prints one JSON line (outcome, failed, flagged).
_OLD_CHILD = r"""
import json, sys
import capplan
assert not capplan.__file__.startswith(%r), "the old tree was not imported"
from capplan.compare import compare
from capplan.errors import SpecError, StudyError
a, b, slo, reps, seed = sys.argv[1:6]
try:
    c = compare(a, b, slo, reps=int(reps), seed=int(seed))
    out = {"outcome": "pass" if c.verdict.passed else "fail", "failed": list(c.verdict.failed),
           "flagged": list(c.verdict.flagged_buckets)}
except (StudyError, SpecError) as e:
    out = {"outcome": "refused", "why": e.format()[:600]}
print(json.dumps(out))
""" % str(Path(__file__).resolve().parents[1] / "capplan")


def sweep(seed: int, slowdown: float = 1.0):
    """The one-replica demo protocol (see the module docstring)."""
    from capplan.sim import preset

    cfg = preset("demo")
    cfg = cfg.with_(seed=seed, replicas=1, system={**cfg.system, "replicas": 1}, rates=RATES,
                    duration_s=300.0, warmup_s=30.0, power=None, itl=False)
    if slowdown != 1.0:
        sm = cfg.replica.service
        sm = replace(sm, decode_step_ms=tuple(slowdown * v for v in sm.decode_step_ms))
        cfg = cfg.with_(replica=replace(cfg.replica, service=sm))
    return cfg


def old_tree(ref: str) -> Path:
    """The capplan package of git revision ``ref``, unpacked once under benchmarks/_data/."""
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", ref], check=True,
                         capture_output=True, text=True).stdout.strip()
    dest = DATA / f"capplan-{sha[:12]}"
    if not (dest / "capplan" / "__init__.py").is_file():
        tmp = Path(tempfile.mkdtemp(dir=DATA))
        arch = subprocess.run(["git", "-C", str(REPO), "archive", sha, "capplan"], check=True,
                              capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=arch, check=True)
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
    return dest


def _child_env(tree: Path | None) -> dict:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def old_compare(tree: Path, a: Path, b: Path, reps: int, seed: int) -> dict:
    r = subprocess.run([sys.executable, "-c", _OLD_CHILD, str(a), str(b), SLO_TEXT, str(reps),
                        str(seed)], capture_output=True, text=True, env=_child_env(tree),
                       cwd=str(tree))  # `python -c` puts the working directory first on sys.path
    if r.returncode != 0:
        return {"outcome": "crashed", "why": r.stderr[-600:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def answer_flags(flagged: list[str]) -> list[tuple[int, str]]:
    """(lower edge, metric) of every flagged requested-answer-length bucket in a verdict."""
    out = []
    for f in flagged:
        m = re.search(r"max_output_tokens \[([\d,]+), [^:]*: (\w+)", f)
        if m:
            out.append((int(m.group(1).replace(",", "")), m.group(2)))
    return out


def long_answers_named(flagged: list[str]) -> bool:
    """A bucket of answers asked ≥ LONG_ANSWER tokens flagged on its failure rate."""
    return any(lo >= LONG_ANSWER and m == "error_rate" for lo, m in answer_flags(flagged))


def one_pair(args) -> dict:
    """Generate the three studies of pair k, compare them (new, and old when asked)."""
    k, seed0, reps, tree = args
    from capplan.compare import compare
    from capplan.errors import SpecError, StudyError
    from capplan.sim import generate_study

    s = seed0 + 2 * k
    out = {"k": k, "seed": s}
    with tempfile.TemporaryDirectory(dir=DATA) as tmp:
        base = generate_study(sweep(s), Path(tmp) / "base", workers=1)[0]
        same = generate_study(sweep(s + 1), Path(tmp) / "same", workers=1)[0]
        slow = generate_study(sweep(s, SLOWDOWN), Path(tmp) / "slow", workers=1)[0]
        for name, cand in (("null", same), ("detect", slow)):
            t0 = time.perf_counter()
            try:
                c = compare(base, cand, SLO_TEXT, reps=reps, seed=k)
                r = {"outcome": "pass" if c.verdict.passed else "fail",
                     "failed": list(c.verdict.failed), "flagged": list(c.verdict.flagged_buckets),
                     "long_named": long_answers_named(list(c.verdict.flagged_buckets)),
                     "paired": c.paired,
                     "families": "".join("S" if f == "steady" else "x"
                                         for f in c.workload["family"])}
            except (StudyError, SpecError) as e:
                r = {"outcome": "refused", "why": e.format()[:600]}
            r["seconds"] = time.perf_counter() - t0
            out[name] = r
            if tree is not None:
                out[f"old_{name}"] = old_compare(tree, base, cand, reps, k)
    return out


def clopper_pearson(k: int, n: int) -> tuple[float, float]:
    from capplan.bootstrap import clopper_pearson as cp

    return cp(k, n, 0.95)


def summarise(rows: list[dict], has_old: bool) -> str:
    n = len(rows)
    lines = [f"{n} pairs, SLO {SLO_TEXT}, protocol: 1 replica, rates {list(RATES)}, 300-s runs",
             "", "| method | case | wanted | rate | 95 % CI (Clopper–Pearson) | refused | "
             "other |", "|---|---|---|---|---|---|---|"]
    for who in ("new", "old") if has_old else ("new",):
        pre = "" if who == "new" else "old_"
        null = [r[pre + "null"]["outcome"] for r in rows]
        det = [r[pre + "detect"]["outcome"] for r in rows]
        k = null.count("pass")
        lo, hi = clopper_pearson(k, n)
        lines.append(f"| {who} | same system, another seed | pass every gate | {k}/{n} = "
                     f"{k / n:.3f} | [{lo:.3f}, {hi:.3f}] | {null.count('refused')} | "
                     f"{n - k - null.count('refused')} failed |")
        k = det.count("fail")
        lo, hi = clopper_pearson(k, n)
        lines.append(f"| {who} | same trace, decode {SLOWDOWN:g}× slower | fail (exit 1) | "
                     f"{k}/{n} = {k / n:.3f} | [{lo:.3f}, {hi:.3f}] | {det.count('refused')} | "
                     f"{n - k - det.count('refused')} passed |")
        if who == "new":
            flags = [answer_flags(r["detect"].get("flagged", [])) for r in rows]
            for what, wanted, hit in (
                    (f"… flags a bucket of answers asked ≥ {LONG_ANSWER} tokens (any metric)",
                     "yes", lambda f: any(lo >= LONG_ANSWER for lo, _ in f)),
                    (f"… flags it on its failure rate (the timeouts)", "yes",
                     lambda f: any(lo >= LONG_ANSWER and m == "error_rate" for lo, m in f)),
                    ("… flags the shortest answers (< 128 tokens) on their failure rate", "no",
                     lambda f: any(lo < 128 and m == "error_rate" for lo, m in f))):
                k = sum(bool(hit(f)) for f in flags)
                lo, hi = clopper_pearson(k, n)
                lines.append(f"| new | {what} | {wanted} | {k}/{n} = {k / n:.3f} | "
                             f"[{lo:.3f}, {hi:.3f}] | | |")
    secs = [r["null"]["seconds"] for r in rows] + [r["detect"]["seconds"] for r in rows]
    if secs:
        lines.append(f"\nnew compare, seconds per comparison: median {sorted(secs)[len(secs) // 2]:.1f}")
    if has_old:
        from collections import Counter

        why = Counter()
        for r in rows:
            for case in ("old_null", "old_detect"):
                o = r[case]
                if o["outcome"] == "fail":
                    why.update(f"{case[4:]}: gate {f.split(':')[0].split(' (')[0]} failed"
                               for f in o["failed"])
                elif o["outcome"] == "refused":
                    m = re.search(r"- run \w+: ([^(]+?) (?:distribution differs|\()", o["why"])
                    why[f"{case[4:]}: refused ({m.group(1) if m else o['why'][:60]})"] += 1
        lines.append("\nold outcomes in detail: " + "; ".join(f"{k} × {v}"
                                                           for k, v in why.most_common()))
    bad = [(r["k"], r["null"]) for r in rows if r["null"]["outcome"] != "pass"]
    for k, r in bad:
        lines.append(f"  null pair {k}: {r['outcome']}: {r.get('failed') or r.get('why')} "
                     f"{r.get('flagged', [])[:3]}")
    return "\n".join(lines)


def timing(tree: Path | None, repeats: int, reps: int) -> str:
    """`capplan compare` end to end on two demo-size studies, old and new, best of N."""
    from capplan.sim import generate_study, preset

    demo = DATA / "demo-seeds"
    a, b = demo / "a", demo / "b"
    for path, seed in ((a, 1), (b, 2)):
        if not (path / "study.yaml").is_file():
            generate_study(preset("demo").with_(seed=seed), path, workers=2)
    a2 = demo / "a-copy"
    if not (a2 / "study.yaml").is_file():
        shutil.copytree(a, a2)
    runs = []
    versions = [("new", None)] + ([("old", tree)] if tree is not None else [])
    for label, (x, y) in (("same trace (copy)", (a, a2)), ("two seeds", (a, b))):
        for who, t in versions:
            best, rc = float("inf"), None
            for _ in range(repeats):
                t0 = time.perf_counter()
                r = subprocess.run([sys.executable, "-m", "capplan", "compare", str(x), str(y),
                                    "--slo", SLO_TEXT, "--reps", str(reps)],
                                   capture_output=True, text=True, env=_child_env(t),
                                   cwd=str(t if t is not None else REPO))
                best = min(best, time.perf_counter() - t0)
                rc = r.returncode
            runs.append((label, who, best, rc))
    load = os.getloadavg()
    lines = [f"`capplan compare` on two demo-size studies (13 rates × 600 s, 2 replicas, ITL "
             f"lists), --reps {reps}, best of {repeats}; load average {load[0]:.1f} "
             f"{load[1]:.1f} {load[2]:.1f} (shared machine)", "",
             "| pair | version | wall s | exit | new / old |", "|---|---|---|---|---|"]
    by = {(lab, who): (s, rc) for lab, who, s, rc in runs}
    for lab, who, s, rc in runs:
        ratio = ""
        if who == "new" and (lab, "old") in by:
            ratio = f"{s / by[(lab, 'old')][0]:.2f}"
        lines.append(f"| {lab} | {who} | {s:.2f} | {rc} | {ratio} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--seed0", type=int, default=1000)
    ap.add_argument("--old-ref", default="main", help="git revision for the before figures")
    ap.add_argument("--no-old", action="store_true", help="skip the old comparison")
    ap.add_argument("--timing", action="store_true", help="time compare on demo-size studies")
    ap.add_argument("--timing-repeats", type=int, default=3)
    ap.add_argument("--json", default=None, help="write every pair's outcome here")
    ap.add_argument("--from-json", default=None, help="re-summarise a --json file and stop")
    args = ap.parse_args(argv)
    if args.from_json:
        rows = json.loads(Path(args.from_json).read_text(encoding="utf-8"))
        print(summarise(rows, "old_null" in rows[0]))
        return 0
    DATA.mkdir(parents=True, exist_ok=True)
    tree = None if args.no_old else old_tree(args.old_ref)
    t0 = time.perf_counter()
    rows = []
    if args.pairs:
        jobs = [(k, args.seed0, args.reps, tree) for k in range(args.pairs)]
        with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as ex:
            for r in ex.map(one_pair, jobs):
                rows.append(r)
                print(f"pair {r['k']}: null {r['null']['outcome']}, detect "
                      f"{r['detect']['outcome']}"
                      + f" (long answers named: {r['detect'].get('long_named')})"
                      + (f"; old: {r['old_null']['outcome']}, {r['old_detect']['outcome']}"
                         if tree is not None else ""), file=sys.stderr, flush=True)
        print(summarise(rows, tree is not None))
        print(f"\n(total {time.perf_counter() - t0:.0f} s, --jobs {args.jobs})")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str), encoding="utf-8")
    if args.timing:
        print()
        print(timing(tree, args.timing_repeats, 1000))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
