"""``fit_twin(study) -> Twin``: estimate a twin from a study's events alone.

Which estimators run depends on what the events hold (docs/twin.md "Estimators"):

- per-token stamps (``itl_ns``) from a batching server, with replica names when there are
  several replicas → the **server path**: scheduler iterations rebuilt from the stamps give the
  decode curve, prefill cost, token budget, max batch and KV capacity; admission stamps
  (``admitted_ns`` / ``prefill_start_ns``) are needed for the prefill and KV parts;
- otherwise → the **client path**: regressions on per-request TTFT and TPOT.

Everything the data cannot show falls back to a stated default, said in the twin's notes and
in twin.yaml (``source: default`` or ``lower bound``) — never a silent guess.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import StudyError
from .data import StudyData, load_study
from .limits_fit import admission_limits, faults, nice_in, queue_limit, stall_masks, timeout_bounds
from .model import Twin
from .params import BOUND, DEFAULT, ENGINE, ESTIMATED, MANIFEST, PARAM_KEYS, DecodePoint, Param
from .service_fit import (client_service, decode_noise, server_budget, server_decode, server_prefill_mixed,
                          server_prefill_separate)
from .slots_fit import lanes_from_data, slots_from_data, slots_from_engine, slots_from_manifest
from .timeline import DECODE, PREFILL, build_timeline
from .workload_fit import fit_workload

MIN_COHERENCE = 0.9  # share of token gaps on the iteration grid needed for the server path
MIN_DECODE_ITERATIONS = 50
MIN_SHARED_TOKENS = 100  # tokens sent while other requests decoded, needed to see batching
DEFAULT_TOKEN_BUDGET = 2048
DEFAULT_MAX_BATCH = 256
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_BLOCK = 16
DEFAULT_WATERMARK = 0.01
DEFAULT_MAX_MODEL_LEN = 16384
ROUTER = "least-outstanding-work"


def _p(key, value, source, how, ci=None, unit=None):
    u = PARAM_KEYS[key][0] if unit is None else unit
    if ci is not None and not all(math.isfinite(float(c)) for c in ci):
        ci = None
    ci = None if ci is None else (round(float(ci[0]), 6), round(float(ci[1]), 6))
    if isinstance(value, float):
        value = round(value, 6)
    return Param(key, value, u, source, how, ci, value)


def _check_usable(data: StudyData) -> None:
    n = sum(r.n for r in data.runs)
    ok_with_first = sum(int(((r.status == 0) & (r.first >= 0)).sum()) for r in data.runs)
    if n == 0:
        raise StudyError("the study has no requests to fit a twin to", file=data.root,
                         fix="give a study with events (capplan validate lists problems)")
    if ok_with_first < 2:
        raise StudyError("cannot fit a twin: fewer than 2 completed requests have first- and last-token times",
                         file=data.root, column="first_token_ns",
                         fix="the twin needs per-request token timings; re-import the load test with them "
                             "(capplan import keeps them when the tool writes them)")


def fit_twin(study, *, runs: tuple[str, ...] | None = None, below_rps: float | None = None, reps: int = 200,
             seed: int = 0, name: str | None = None) -> Twin:
    """Fit a twin to ``study`` (a path or an opened Study). ``runs`` restricts the runs used;
    ``below_rps`` keeps only runs offered below that rate (held-out validation). ``reps``
    bootstrap replicates give each parameter's 95 % interval; ``seed`` makes them repeatable."""
    data = load_study(study)
    if runs is not None or below_rps is not None:
        keep = tuple(r.run_id for r in data.runs
                     if (runs is None or r.run_id in runs)
                     and (below_rps is None or (r.offered_rps is not None and r.offered_rps < below_rps)))
        if not keep:
            raise StudyError(f"no run left to fit (runs below {below_rps:g} req/s)" if below_rps is not None
                             else "no run left to fit", file=data.root,
                             fix="choose a higher --holdout rate or other runs")
        data = load_study(study, runs=keep)
    return fit_data(data, reps=reps, seed=seed, name=name, below_rps=below_rps)


@dataclass(frozen=True)
class _Service:
    """What the service fit found: the path, the rebuilt iterations (server path), the decode
    curve, the prefill cost, the prefill mode and the token budget when seen."""

    server: bool
    tl: object  # the scheduler timeline (server path), else None or an unusable one
    dec: object
    pf: object
    mode: str
    mode_how: str
    budget: tuple | None
    boundary_var: float
    method: str


def fit_data(data: StudyData, *, reps: int = 200, seed: int = 0, name: str | None = None,
             below_rps: float | None = None) -> Twin:
    """Fit a twin to loaded study data, in order: the service (decode curve, prefill cost and
    mode, from the server or the client path), the limits (timeout, slots, KV capacity, token
    budget, queue limit, faults), then the workload."""
    _check_usable(data)
    rng = np.random.default_rng([int(seed), 11])
    notes: list[str] = []
    replicas = int(data.replicas)
    params: list[Param] = [
        _p("replicas", replicas, MANIFEST, "study.yaml system.replicas"),
        _router(data, notes),
    ]
    sv = _fit_service(data, replicas, reps, rng, notes)
    params.extend(_prefill_params(data, sv, notes))
    tl = sv.tl if sv.server else None
    timeout, tb = _timeout_param(data, tl, notes)
    wait_s = float(tb.lo or 0.0)
    slots, mb_seen = _slot_params(data, sv, timeout, notes)
    params.extend(slots)
    params.extend(_budget_and_length_params(data, sv, notes))
    ql = queue_limit(data, float(timeout.value))
    if ql.binding:
        params.append(_p("queue_limit", int(ql.value), ESTIMATED, ql.how))
    else:
        params.append(_p("queue_limit", None, DEFAULT, ql.how + "; the twin's queue is unbounded"))
        if ql.n:
            notes.append("queue limit: " + ql.how + "; the twin's queue is unbounded (it rejects nothing)")
    params.append(timeout)
    fl = faults(data, wait_s)
    params.append(_p("error_share", fl.error_share, ESTIMATED,
                     f"{fl.n_errors:,} of {fl.n:,} requests ended in an error; the twin does not model why — "
                     "replays keep these requests' status and new runs fail this share at random"))
    params.append(_p("stall_share", fl.stall_share, ESTIMATED,
                     f"{fl.n_stalls:,} of {fl.n:,} requests got no token although requests scheduled after them were "
                     "served (not a queueing effect); replays keep them, new runs stall this share at random"))
    nz = decode_noise(tl, sv.dec)
    params.append(_p("decode_noise_cv", round(nz.cv, 4), ESTIMATED,
                     nz.how + "; reported, not simulated: the twin's decode steps are exact, so a server noisier "
                     "than this fit shows wider tails than the twin (twin check names it)"))
    # ------------------------------------------------------------------ workload
    wl, wnotes = fit_workload(data, wait_s)
    notes.extend(wnotes)
    order = [k for k in PARAM_KEYS]
    params.sort(key=lambda p: order.index(p.key))
    dec = sv.dec
    decode = tuple(DecodePoint(int(k), round(float(v), 6), (round(float(lo), 6), round(float(hi), 6)),
                               round(float(v), 6))
                   for k, v, lo, hi in zip(dec.knots, dec.ms, dec.ci_low, dec.ci_high))
    source = _source(data, sv, mb_seen, nz, below_rps)
    return Twin(name=name or f"twin of {data.name}", params=tuple(params), decode=decode, decode_how=dec.how,
                workload=wl, source=source, notes=tuple(notes), measured_decode=dec.measured)


def _fit_service(data: StudyData, replicas: int, reps: int, rng, notes: list[str]) -> _Service:
    """Choose the path (server when per-token stamps show a shared iteration grid, else
    client) and fit the decode curve, the prefill cost and the prefill mode on it."""
    missing_cols = [c for c in ("itl_ns", "admitted_ns", "replica_group") if not data.has(c)
                    and not (c == "admitted_ns" and data.has("prefill_start_ns"))
                    and not (c == "replica_group" and replicas == 1)]
    per_token = _gaps_per_token(data)
    tl = build_timeline(data) if data.has("itl_ns") and per_token >= 0.99 else None
    # the grid: every token gap spans one iteration — or, when first tokens come off the grid
    # (prefill on its own lane), every decode gap does
    on_grid = tl is not None and (tl.coherence >= MIN_COHERENCE or (
        tl.coherence_decode >= MIN_COHERENCE and tl.first_on_grid < 0.5))
    server = (on_grid and tl.n_sharing >= MIN_SHARED_TOKENS
              and tl.sharing >= MIN_COHERENCE and int((tl.kind == DECODE).sum()) >= MIN_DECODE_ITERATIONS)
    if data.has("itl_ns") and per_token < 0.99:
        notes.append(f"the gap lists (itl_ns) hold fewer gaps than tokens for {1 - per_token:.0%} of completed "
                     "requests (the client saw chunks, not tokens): service times come from per-request client "
                     "timings")
    elif tl is not None and not server:
        notes.append(f"the token stamps show no common iteration grid (of {tl.n_sharing:,} tokens sent while other "
                     f"requests were decoding, {0 if tl.sharing != tl.sharing else tl.sharing:.0%} share a stamp "
                     "with another request's token; a batching server with exact stamps gives ≈ 100 %): service "
                     "times come from per-request client timings")
    if server:
        sv = _server_service(data, tl, replicas, reps, rng, notes)
    else:
        cs = client_service(data, replicas=replicas, reps=reps, rng=rng)
        if cs is None:
            raise StudyError("cannot fit a twin: no completed request with at least 2 output tokens to time the "
                             "decode", file=data.root, column="output_tokens",
                             fix="give a study whose completed requests stream several tokens")
        if missing_cols:
            notes.append("missing " + ", ".join(missing_cols) + ": max batch, token budget, KV capacity and the queue "
                         "limit cannot be seen and fall back to defaults (below)")
        sv = _Service(False, tl, cs.decode, cs.prefill, cs.mode, cs.how_mode, None, cs.boundary_var,
                      "client path: per-request TTFT and TPOT (no usable per-token server stamps)")
    if sv.pf is None or not math.isfinite(sv.pf.ms_per_token):
        raise StudyError("cannot fit a twin: no request's prefill could be timed", file=data.root,
                         column="first_token_ns", fix="give a study with first-token times of completed requests")
    notes.extend(sv.pf.notes)
    return sv


def _server_service(data: StudyData, tl, replicas: int, reps: int, rng, notes: list[str]) -> _Service:
    """The server path: the prefill mode from where first tokens fall on the grid, the decode
    curve from the rebuilt iterations, the prefill cost (and token budget) from prefill
    iterations, separate lanes' admission stamps, or the client timings when there are none."""
    boundary_var = 0.0
    mode = "mixed" if not (tl.first_on_grid < 0.5) else "separate"
    mode_how = (f"{tl.first_on_grid:.0%} of first tokens sent while other requests were decoding came out "
                "together with their decode tokens: " + (
                    "prompts run inside the batch iteration (mixed)" if mode == "mixed" else
                    "prompts finish off the iteration grid, i.e. on their own resource (separate)"))
    t0 = timeout_bounds(data, tl)
    t_guess = t0.value or (data_manifest_client(data) or {}).get("timeout_s") or DEFAULT_TIMEOUT_S
    if mode == "separate" or any(((r.admitted >= 0) & (r.first < 0)).any() for r in data.runs):
        tl = build_timeline(data, separate=mode == "separate", timeout_s=float(t_guess))
    dec = server_decode(tl, reps=reps, rng=rng)
    budget = None
    stamps = data.has("admitted_ns") or data.has("prefill_start_ns")
    if mode == "mixed" and (tl.kind == PREFILL).any():
        pf0 = server_prefill_mixed(tl, dec, reps=reps, rng=rng)
        budget = server_budget(tl, dec, pf0, reps=reps, rng=rng)
        pf = server_prefill_mixed(tl, dec, reps=reps, rng=rng, budget=budget[0] if budget else None)
    elif mode == "separate" and stamps:
        pf = server_prefill_separate(data, reps=reps, rng=rng)
    else:
        # separate prefill sends the first token when its lane finishes, not at an iteration end
        cs = client_service(data, replicas=replicas, reps=reps, rng=rng, boundary=mode != "separate")
        pf = cs.prefill if cs is not None else None
        boundary_var = cs.boundary_var if cs is not None else 0.0
        notes.append("no admission stamps (admitted_ns / prefill_start_ns): prefill cost comes from the TTFT of "
                     "requests that found the server nearly idle (client path)" if mode != "separate" else
                     "no admission stamps (admitted_ns / prefill_start_ns): prefill cost comes from the TTFT of "
                     "requests that found no other prompt pending (client timings)")
    method = "server path: iterations rebuilt from per-token stamps" + (
        " and admission stamps" if stamps else "") + (
        f" (stamps of one iteration grouped within {tl.tol_ms[0]:.3g}–{tl.tol_ms[1]:.3g} ms, scaled to each "
        "run's stamps)" if tl.tol_ms[1] > 0.2 + 1e-9 else "")
    return _Service(True, tl, dec, pf, mode, mode_how, budget, boundary_var, method)


def _prefill_params(data: StudyData, sv: _Service, notes: list[str]) -> list[Param]:
    """prefill_mode, prefill_lanes, prefill_ms_per_token, prefill_overhead_ms, prefill_jitter_cv."""
    pf, mode = sv.pf, sv.mode
    out = [_p("prefill_mode", mode, ESTIMATED, sv.mode_how)]
    if mode == "separate":
        ln = lanes_from_data(data, lambda p: pf.overhead_ms + pf.ms_per_token * p)
        out.append(_p("prefill_lanes", ln.value, ESTIMATED if ln.value is not None else DEFAULT, ln.how))
        if ln.value is None:
            notes.append(f"prefill lanes: {ln.how}")
    else:
        out.append(_p("prefill_lanes", None, ESTIMATED, "not used with mixed prefill: prompts are computed in "
                      "chunks inside the decode iterations"))
    out.append(_p("prefill_ms_per_token", float(pf.ms_per_token), ESTIMATED, pf.how, pf.ci_per_token))
    out.append(_p("prefill_overhead_ms", float(pf.overhead_ms), ESTIMATED, pf.how, pf.ci_overhead))
    if mode == "separate":
        jit = pf.jitter_cv(sv.boundary_var)
        out.append(_p("prefill_jitter_cv", round(jit, 4), ESTIMATED,
                      f"standard deviation of single prefill times around the fitted line"
                      + (" (less the wait for the next iteration boundary, which the simulator draws itself)"
                         if sv.boundary_var else "") + f" / their mean {pf.mean_ms:.3g} ms; each prompt's lane time "
                      "is multiplied by a lognormal factor with mean 1 and this CV"))
    else:
        out.append(_p("prefill_jitter_cv", 0.0, DEFAULT, "not used with mixed prefill: the simulator's iteration "
                      "times have no noise"))
    return out


def _timeout_param(data: StudyData, tl, notes: list[str]):
    """The client timeout: bracketed by the events, else study.yaml, else a bound or a default
    said out loud. Returns (the parameter, the bounds)."""
    tb = timeout_bounds(data, tl)
    stalls0 = stall_masks(data, float(tb.lo or 0.0))
    load_timeouts = sum(int(((r.status == 2) & ~stalls0[r.run_id]).sum()) for r in data.runs)
    manifest_timeout = ((data_manifest_client(data) or {}).get("timeout_s"))
    if tb.value is not None:
        timeout = _p("client_timeout_s", float(tb.value), ESTIMATED,
                     f"the roundest value between the longest successful request ({tb.lo:.3f} s after its schedule) "
                     f"and the first iteration boundary after the last token of a request that timed out while "
                     f"generating ({tb.hi:.3f} s); {tb.n:,} requests timed out", (tb.lo, tb.hi))
    elif manifest_timeout:
        timeout = _p("client_timeout_s", float(manifest_timeout), MANIFEST,
                     "study.yaml workload.client.timeout_s (the events do not bracket it)")
    elif tb.n and load_timeouts and (tb.lo or 0) >= 1.0:
        val = nice_in(tb.lo, tb.lo * 1.02)
        timeout = _p("client_timeout_s", float(val), ESTIMATED,
                     f"{tb.n:,} requests timed out under load and the longest successful one took {tb.lo:.3f} s: the "
                     f"timeout is taken as the roundest value within 2 % above it ({val:g} s) — client timings cannot "
                     "see the deadline itself")
    else:
        val = max(DEFAULT_TIMEOUT_S, math.ceil(tb.lo or 0.0))
        timeout = _p("client_timeout_s", float(val), DEFAULT if tb.n == 0 else BOUND,
                     (f"no request timed out while generating, so the timeout cannot be timed; it is at least "
                      f"{tb.lo:.3f} s (the longest successful request); default {val:g} s")
                     if tb.n == 0 else
                     (f"{tb.n} request(s) timed out before any token, which does not time the timeout; it is at least "
                      f"{tb.lo:.3f} s (the longest successful request); default {val:g} s"))
        notes.append(f"client timeout: {timeout.how}")
    return timeout, tb


def _slot_params(data: StudyData, sv: _Service, timeout: Param, notes: list[str]):
    """max_batch and kv_capacity_tokens: from admission stamps on the server path (binding, or
    the engine's / study.yaml's word, or a bound), else the slots without admission stamps and
    a default KV size. Returns (parameters, the largest batch seen)."""
    out = []
    if sv.server and (data.has("admitted_ns") or data.has("prefill_start_ns")):
        adm = admission_limits(data, sv.tl, float(timeout.value), block_size=DEFAULT_BLOCK)
        if adm.max_batch.binding:
            out.append(_p("max_batch", int(adm.max_batch.value), ESTIMATED, adm.max_batch.how))
        else:
            said = slots_from_engine(data.system) or slots_from_manifest(data.system)
            if said is not None:
                out.append(_said_max_batch(said, adm.max_batch.how, int(adm.max_batch.value), data.system, notes))
            else:
                mb = max(int(adm.max_batch.value), DEFAULT_MAX_BATCH)
                out.append(_p("max_batch", mb, BOUND, adm.max_batch.how + f"; it is at least that: default {mb}"))
                notes.append(f"max batch: the batch never filled up and neither the engine's configuration nor "
                             f"study.yaml names a limit; the twin uses {mb} (at least the {int(adm.max_batch.value)} "
                             "seen)")
        if adm.kv_tokens.binding:
            out.append(_p("kv_capacity_tokens", int(round(adm.kv_tokens.value)), ESTIMATED, adm.kv_tokens.how,
                          (adm.kv_tokens.lo, adm.kv_tokens.hi)))
        else:
            peak = float(adm.kv_tokens.lo or 0.0)
            val = int(max(2 * peak, 65536))
            out.append(_p("kv_capacity_tokens", val, BOUND,
                          adm.kv_tokens.how + f"; the twin assumes {val:,} (twice that, at least 65,536) — set your "
                          "engine's KV size (e.g. vLLM logs 'GPU KV cache size: N tokens')"))
            notes.append(f"KV capacity: never binding in the data (peak {peak:,.0f} tokens held); the twin assumes "
                         f"{val:,} tokens per replica")
        return out, int(adm.max_batch.value)
    out.append(_max_batch_without_admission(data, notes))
    out.append(_p("kv_capacity_tokens", 1_000_000, DEFAULT,
                  "needs per-token and admission stamps per replica; default 1,000,000 tokens (effectively "
                  "unlimited)"))
    notes.append("KV capacity cannot be seen without per-token and admission stamps per replica "
                 "(itl_ns, admitted_ns, replica_group): default 1,000,000 tokens")
    return out, 0


def _budget_and_length_params(data: StudyData, sv: _Service, notes: list[str]) -> list[Param]:
    """token_budget (seen on the server path with mixed prefill, else a default), the KV block
    size and watermark (vLLM's defaults) and max_model_len (at least the longest request)."""
    out = []
    budget, mode = sv.budget, sv.mode
    if budget is not None:
        out.append(_p("token_budget", int(round(budget[0])), ESTIMATED,
                      f"median over {budget[2]:,} iterations that computed one full chunk of a long prompt of "
                      "(iteration − decode step − overhead) / ms per token + decodes; 95 % interval: bootstrap over "
                      "blocks of iterations", budget[1]))
    else:
        seen = int(sv.tl.n_running.max()) if sv.server else 0
        val = max(DEFAULT_TOKEN_BUDGET, seen)
        why = ("no prompt was split over iterations" if sv.server and mode == "mixed" else
               "prefill runs on its own resource" if mode == "separate" else "needs per-token stamps")
        out.append(_p("token_budget", val, DEFAULT, f"{why}: default {val}"))
        if mode == "mixed":
            notes.append(f"token budget: {why}; default {val} tokens per iteration")
    out.append(_p("kv_block_size", DEFAULT_BLOCK, DEFAULT, "not visible in events; vLLM's default 16"))
    out.append(_p("kv_watermark", DEFAULT_WATERMARK, DEFAULT, "not visible in events; vLLM's default 0.01"))
    longest = max([int(np.max(r.inp + r.out)) for r in data.runs if r.n] + [0])
    mml = max(DEFAULT_MAX_MODEL_LEN, longest)
    out.append(_p("max_model_len", mml, DEFAULT, f"not visible unless requests were refused for length; "
                  f"default {DEFAULT_MAX_MODEL_LEN:,} (at least the longest request seen, {longest:,})"))
    return out


def _source(data: StudyData, sv: _Service, mb_seen: int, nz, below_rps: float | None) -> dict:
    """Where the twin came from (twin.yaml ``source``)."""
    dec, tl = sv.dec, sv.tl
    source = {"study": data.name, "path": data.root, "sha256": data.sha256, "runs": [r.run_id for r in data.runs],
              "requests": sum(r.n for r in data.runs), "method": sv.method, "system": dict(data.system),
              "decode_residual_cv": round(dec.residual_cv, 4) if math.isfinite(dec.residual_cv) else None,
              "max_batch_seen": mb_seen}
    if below_rps is not None:
        source["fitted_below_rps"] = float(below_rps)
    if sv.server:
        source["grid_coherence"] = round(tl.coherence, 4)
        source["grid_coherence_decode"] = round(tl.coherence_decode, 4)
        source["grid_tolerance_ms"] = [round(tl.tol_ms[0], 4), round(tl.tol_ms[1], 4)]
    source["decode_noise"] = {"cv": round(nz.cv, 4), "per_step": nz.per_step, "iterations": nz.n,
                              "share_off_25pct": None if not math.isfinite(nz.share_off) else round(nz.share_off, 4)}
    return source


def _said_max_batch(said: tuple[int, str], seen_how: str, seen: int, system: dict, notes: list[str]) -> Param:
    """The engine's (or study.yaml's) slot limit, when the data do not show one binding."""
    val, where = said
    src = ENGINE if slots_from_engine(system) is not None else MANIFEST
    how = f"{where}; the data do not show it binding ({seen_how})"
    if seen > val:
        notes.append(f"max batch: {where} says {val}, but {seen} sequences were seen decoding together — the "
                     "configuration may not be the one measured")
    return _p("max_batch", int(val), src, how)


def _max_batch_without_admission(data: StudyData, notes: list[str]) -> Param:
    """Slots without admission stamps, in order of trust: what the data show binding, the
    engine's own configuration or metrics, study.yaml, and only then a stated default."""
    seen = slots_from_data(data) if (data.replica_names or data.replicas == 1) else None
    said = slots_from_engine(data.system) or slots_from_manifest(data.system)
    if seen is not None and seen.binding:
        if said is not None and said[0] != int(seen.value):
            notes.append(f"max batch: the data show {int(seen.value)} sequences binding; {said[1]} says {said[0]} — the "
                         "twin trusts the data (the configuration may not be the one measured)")
        return _p("max_batch", int(seen.value), ESTIMATED, seen.how)
    seen_how = seen.how if seen is not None else ("several replicas without replica_group: sequences per replica "
                                                  "cannot be counted")
    if said is not None:
        return _said_max_batch(said, seen_how, int(seen.value or 0) if seen is not None else 0, data.system, notes)
    lo = int(seen.value) if seen is not None and seen.value else 0
    mb = max(lo, DEFAULT_MAX_BATCH)
    notes.append(f"max batch: the data show no slot limit binding and neither the engine's configuration "
                 f"(study.yaml system.engine_config) nor study.yaml (system.max_batch) names one; the twin uses "
                 f"{mb}" + (f" (at least the {lo} seen decoding together)" if lo else "") + " — set your engine's "
                 "limit (vLLM --max-num-seqs, llama.cpp -np)")
    return _p("max_batch", mb, BOUND if lo else DEFAULT, seen_how + f"; default {mb}")


def _router(data: StudyData, notes: list[str]) -> Param:
    """The router from study.yaml (a capplan-synth manifest records it), else assumed."""
    said = ((data.workload or {}).get("replica") or {}).get("router") or (data.system or {}).get("router")
    if said and "least outstanding work" in str(said).replace("-", " "):
        return _p("router", ROUTER, MANIFEST, f"study.yaml says {said!r}")
    how = ("assumed: each request goes to the replica with the least outstanding work (prompt tokens to compute "
           "+ decode steps to run); the events do not show the router's rule")
    if said:
        notes.append(f"router: study.yaml says {said!r}, which the twin does not model; it uses least outstanding work")
        how = f"study.yaml says {said!r}, not modelled; " + how
    return _p("router", ROUTER, DEFAULT, how)


def _gaps_per_token(data: StudyData) -> float:
    """Share of completed multi-token requests whose gap list has output_tokens − 1 gaps."""
    num = den = 0
    for r in data.runs:
        if r.itl_has is None:
            continue
        m = (r.status == 0) & (r.out >= 2) & r.itl_has
        den += int(m.sum())
        num += int((np.diff(r.itl_off)[m] == r.out[m] - 1).sum())
    return num / den if den else 0.0


def data_manifest_client(data: StudyData) -> dict | None:
    """The client block a capplan-synth manifest records (workload.client), if any."""
    cl = (data.workload or {}).get("client")
    return cl if isinstance(cl, dict) else None
