"""The what-if arithmetic, testable without widgets.

:class:`WhatIfModel` does the slow part once — open the study, fit the envelope (the only step
that reads events), read the plan spec — and can keep it on disk (``cache=``): the reduced
statistics, fitted envelope and study facts are pickled under a key of everything they depend
on (study content, SLO, replicates, seed, confidence, capplan version and the code of the
modules that compute them), so a second kernel (a
second what-if user) starts in about a second instead of re-reading the study.

:func:`whatif_state` is then a pure function of the model and a :class:`WhatIfParams`: the
envelope for that SLO (a refit from the cached statistics when the limits are on the
reduction's grid; an exact fit, kept in memory and on disk, when they are round values off
it), ``make_plan``, and what the panel shows — the plan table, the quarters (dated), the
figure. A position with no usable capacity raises :class:`NoCapacity`, whose message says in
plain words what to change.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..version import __version__
from ..errors import CapplanError, SpecError
from ..present import MISSING, is_missing
from ..slo import SLO

#: Attainment targets offered by the slider.
ATTAINMENT_CHOICES = (0.9, 0.95, 0.98, 0.99, 0.995, 0.999)
POLICY_LABELS = {"none": "no reserve", "node": "survive losing a node", "zone": "survive losing a zone",
                 "n_plus_k": "survive losing k groups (N + k)"}
CAPACITY_USES = {"lower_bound": "C_SLO lower bound", "estimate": "C_SLO estimate"}
#: round limit values (ms) the TTFT / TPOT sliders offer: 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7.5 × 10^k
NICE = (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 7.5)
#: Plan line items shown in the panel's table, in order.
TABLE_KEYS = ("peak_rps", "demand_rps", "capacity_rps_per_group", "traffic_groups",
              "failure_reserve_groups", "rollout_overlap_groups", "cold_start_reserve_groups",
              "total_groups", "total_gpus", "billed_gpus", "nodes", "utilisation_at_peak_pct",
              "cost_usd_per_month", "cost_usd_per_year", "cost_usd_per_1k_good_requests")
CACHE_VERSION = 1


class NoCapacity(CapplanError):
    """These settings give no usable capacity; the message says what to change, in words."""


@dataclass(frozen=True)
class WhatIfParams:
    """One position of every control."""

    ttft_ms: float | None
    tpot_ms: float | None
    attainment: float
    peak_rps: float
    uncertainty: float
    policy: str
    price_usd_per_gpu_hour: float
    capacity_use: str = "lower_bound"

    def slo(self, base: SLO) -> SLO:
        return base.with_(ttft_ms=self.ttft_ms, tpot_ms=self.tpot_ms, attainment=self.attainment)

    def with_(self, **kw) -> "WhatIfParams":
        return replace(self, **kw)


@dataclass(frozen=True)
class WhatIfState:
    """What the panel shows for one WhatIfParams."""

    params: WhatIfParams
    table: pd.DataFrame
    figure: go.Figure
    plan: object = field(repr=False)
    envelope: object = field(repr=False)
    seconds: float = 0.0
    quarters: pd.DataFrame = field(default=None, repr=False)


def nice_values(lo: float, hi: float) -> list[float]:
    """The round values (NICE × 10^k) between lo and hi."""
    out = []
    k = math.floor(math.log10(lo)) - 1
    while True:
        for m in NICE:
            v = round(m * 10 ** k, 10)
            if v > hi * (1 + 1e-9):
                return out
            if v >= lo * (1 - 1e-9):
                out.append(float(f"{v:.6g}"))
        k += 1


def cache_dir() -> Path:
    """Where reduced statistics are kept: $CAPPLAN_CACHE_DIR, else $XDG_CACHE_HOME/capplan,
    else ~/.cache/capplan."""
    env = os.environ.get("CAPPLAN_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "capplan"


class WhatIfModel:
    """The cached, slow part: study, fitted envelope, base plan spec (read-only after build)."""

    def __init__(self, study, envelope, spec, slo: SLO, *, facts=None, cache: Path | None = None,
                 study_hash: str | None = None):
        self.study = study
        self.envelope = envelope
        self.spec = spec
        self.slo = slo
        self.cache = cache
        self.study_hash = study_hash
        self._envelopes: dict[tuple, object] = {}
        self._facts: dict[str, object] = {}
        if facts is not None:
            self._facts[str(slo)] = facts

    # ------------------------------------------------------------------ building
    @classmethod
    def build(cls, study=None, spec=None, slo=None, *, confidence: float | None = None,
              reps: int | None = None, seed: int | None = None, cache=False,
              progress=None) -> "WhatIfModel":
        """Open the study (default: the bundled demo), read the spec (default:
        templates/plan.yaml), fit the envelope once (the slow reduction). SLO, confidence, reps
        and seed default to the spec's, as in ``capplan plan`` and ``capplan report``.
        ``cache``: True (the default cache folder, :func:`cache_dir`) or a folder: load the
        fitted statistics from there when present, else fit and save them. ``progress(step,
        text)`` is told what is happening (for a progress bar)."""
        from ..envelope import fit_envelope
        from ..notebook import resolve

        say = progress or (lambda step, text: None)
        say(1, "opening the study and the plan spec")
        nb = resolve(study, spec, slo, seed=seed, reps=reps, confidence=confidence)
        folder = (cache_dir() if cache is True else Path(cache)) if cache else None
        study_hash = nb.study.content_hash() if folder else None
        key = _key(study_hash, nb.slo, nb.reps, nb.seed, nb.confidence) if folder else None
        hit = _load(folder, key) if folder else None
        if hit is not None:
            say(2, "reading the cached statistics")
            env, facts = hit
            env = _reattach(env, nb.study)
        else:
            say(2, "fitting the capacity envelope (reads every request once)")
            env = fit_envelope(nb.study, nb.slo, confidence=nb.confidence, reps=nb.reps, seed=nb.seed)
            say(3, "reading the study's facts (good fraction, tokens, energy)")
            from ..cost import study_facts

            facts = study_facts(nb.study, nb.slo)
            if folder:
                _save(folder, key, (env, facts))
        return cls(nb.study, env, nb.spec, nb.slo, facts=facts, cache=folder, study_hash=study_hash)

    def defaults(self) -> WhatIfParams:
        s = self.spec
        return WhatIfParams(
            ttft_ms=self.slo.ttft_ms, tpot_ms=self.slo.tpot_ms, attainment=self.slo.attainment,
            peak_rps=s.demand.total_peak_rps, uncertainty=s.demand.uncertainty,
            policy=s.failure.policy, price_usd_per_gpu_hour=s.prices.usd_per_gpu_hour or 0.0,
            capacity_use=s.capacity.use)

    def limit_choices(self, axis: str, value: float) -> list[float] | None:
        """Round limits (ms) the sliders offer on ``axis`` ("x" = TTFT, "y" = TPOT), over the
        range of the reduction's grid, with ``value`` among them; None without a grid."""
        stats = getattr(self.envelope, "stats", None)
        grid = getattr(stats, "grid_spec", None)
        if grid is None or (axis == "y" and grid.y_metric != "tpot"):
            return None
        finite = [float(v) for v in grid.limits(axis) if math.isfinite(v)]
        return sorted(set(nice_values(min(finite), max(finite))) | {float(value)})

    # ------------------------------------------------------------------ envelopes and facts
    def _on_grid(self, slo: SLO) -> bool:
        stats = getattr(self.envelope, "stats", None)
        if stats is None or not stats.can_serve(slo):
            return stats is None
        eff = stats.effective_slo(slo)
        return all((getattr(eff, k) is None and getattr(slo, k) is None)
                   or (getattr(eff, k) is not None and getattr(slo, k) is not None
                       and math.isclose(getattr(eff, k), getattr(slo, k), rel_tol=1e-9))
                   for k in ("ttft_ms", "tpot_ms", "itl_ms"))

    def envelope_for(self, slo: SLO, progress=None):
        """The envelope at ``slo``, exact: a refit from the cached statistics when its limits are
        on their grid, else a fit at exactly these limits (memoised, and cached on disk)."""
        if self._on_grid(slo):
            return self.envelope.refit(slo=slo)
        limits = (slo.ttft_ms, slo.tpot_ms, slo.itl_ms, slo.e2e_ms)
        env = self._envelopes.get(limits)
        if env is None:
            base = self.slo.with_(ttft_ms=slo.ttft_ms, tpot_ms=slo.tpot_ms, itl_ms=slo.itl_ms,
                                  e2e_ms=slo.e2e_ms)
            key = _key(self.study_hash, base, self.envelope.reps, self.envelope.seed,
                       self.envelope.confidence) if self.cache else None
            hit = _load(self.cache, key) if key else None
            if hit is not None:
                env = _reattach(hit[0], self.study)
            else:
                if progress:
                    progress(f"re-reading the study for {slo.describe()} (a few seconds; then it is kept)")
                from ..envelope import fit_envelope

                env = fit_envelope(self.study, base, confidence=self.envelope.confidence,
                                   reps=self.envelope.reps, seed=self.envelope.seed)
                if key:
                    _save(self.cache, key, (env, None))
            self._envelopes[limits] = env
        return env if env.slo == slo else env.refit(slo=slo)

    def facts(self, slo: SLO):
        key = str(slo)
        if key not in self._facts:
            from ..cost import study_facts

            self._facts[key] = study_facts(self.study, slo)
        return self._facts[key]

    # ------------------------------------------------------------------ plain-words advice
    def no_capacity_message(self, params: WhatIfParams) -> str:
        """Why these settings give no plan and what to change, in words (no CLI options)."""
        slo = params.slo(self.slo)
        levels = getattr(self.envelope, "levels", None)
        lowest = float(levels["x"].min()) if levels is not None and len(levels) else None
        lead = (f"No plan at these settings: even the lowest tested rate"
                + (f" ({lowest:.3g} req/s)" if lowest else "") + f" misses {slo.describe()}.")
        fixes = []
        looser = self._first_usable("x", params)
        if looser is not None:
            fixes.append(f"loosen the TTFT limit to {looser:,.0f} ms or more")
        looser = self._first_usable("y", params)
        if looser is not None:
            fixes.append(f"loosen the TPOT limit to {looser:,.0f} ms or more")
        lower = [a for a in ATTAINMENT_CHOICES if a < params.attainment and self._usable(params.with_(attainment=a))]
        if lower:
            fixes.append(f"lower the attainment target to {max(lower):g}")
        if params.capacity_use == "lower_bound" and self._usable(params.with_(capacity_use="estimate")):
            fixes.append("plan on the C_SLO estimate (optimistic)")
        advice = ("To get a plan, " + ", or ".join(fixes) + "." if fixes else
                  "No control position nearby gives a plan.")
        return (f"{lead} {advice} To plan at this limit, the load test needs runs at lower request rates. "
                "The plan shown before is hidden because it no longer matches the controls.")

    def _usable(self, params: WhatIfParams) -> bool:
        """Whether a position has a capacity — for advice, so off-grid limits not fitted yet are
        judged at the nearest grid limit (a cheap refit, no re-reading)."""
        slo = params.slo(self.slo)
        limits = (slo.ttft_ms, slo.tpot_ms, slo.itl_ms, slo.e2e_ms)
        try:
            if self._on_grid(slo):
                env = self.envelope.refit(slo=slo)
            elif limits in self._envelopes:
                env = self.envelope_for(slo)
            else:
                env = self.envelope.refit(slo=self.envelope.stats.effective_slo(slo))
        except (CapplanError, AttributeError):
            return False
        v = getattr(env.cslo, params.capacity_use, None)
        return v is not None and v == v and v > 0 and math.isfinite(v)

    def _first_usable(self, axis: str, params: WhatIfParams) -> float | None:
        """The smallest round limit on ``axis`` above the current one that has a capacity
        (searched on the cached grid, so it costs a few refits, no re-reading)."""
        stats = getattr(self.envelope, "stats", None)
        grid = getattr(stats, "grid_spec", None)
        current = params.ttft_ms if axis == "x" else params.tpot_ms
        if grid is None or current is None or (axis == "y" and grid.y_metric != "tpot"):
            return None
        limits = [float(v) for v in grid.limits(axis) if math.isfinite(v) and v > current]
        for v in limits:
            p = params.with_(**({"ttft_ms": v} if axis == "x" else {"tpot_ms": v}))
            if self._usable(p):
                nice = [x for x in (self.limit_choices(axis, current) or []) if x >= v]
                return nice[0] if nice else v
        return None


# ----------------------------------------------------------------------------- disk cache


#: the modules whose code the cached statistics depend on (a change to any makes a new key)
_CODE = ("envelope", "reduce", "bootstrap", "sketch", "diagnostics", "metrics", "cost", "slo", "study",
         "contract", "earlystop")


def _code_fingerprint() -> str:
    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for name in _CODE:
        p = root / f"{name}.py"
        h.update(p.read_bytes() if p.is_file() else name.encode())
    return h.hexdigest()[:16]


def _key(study_hash, slo: SLO, reps, seed, confidence) -> str:
    payload = json.dumps({"v": CACHE_VERSION, "capplan": __version__, "code": _code_fingerprint(),
                          "study": study_hash, "slo": str(slo), "reps": int(reps), "seed": int(seed),
                          "confidence": float(confidence)}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def _load(folder: Path | None, key: str | None):
    if folder is None or key is None:
        return None
    path = folder / f"whatif-{key}.pkl"
    try:
        with open(path, "rb") as fh:
            return pickle.load(fh)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
        return None


def _save(folder: Path, key: str, value) -> None:
    """Atomically (temp file, rename), so a second kernel never reads half a file. The cache is
    this user's own folder: its files are loaded with pickle."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".whatif-{key}.{os.getpid()}.tmp"
        with open(tmp, "wb") as fh:
            pickle.dump(value, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, folder / f"whatif-{key}.pkl")
    except OSError:
        pass  # a read-only cache folder only costs the next kernel a re-fit


def _reattach(env, study):
    """An unpickled envelope re-reduces from its study when a change needs events (e.g. an E2E
    limit); point it at this process's study."""
    stats = getattr(env, "stats", None)
    if stats is not None and getattr(stats, "source", None) is not None:
        try:
            object.__setattr__(stats, "source", str(study.root))
        except (AttributeError, TypeError):
            pass
    return env


# ----------------------------------------------------------------------------- the state


def _fmt_value(v, unit: str) -> str:
    if is_missing(v) or not math.isfinite(v):
        return MISSING
    if unit.startswith("USD") or unit.startswith("$"):
        return f"${v:,.2f}" if abs(v) < 100 else f"${v:,.0f}"
    if float(v).is_integer():
        return f"{v:,.0f}"
    return f"{v:,.4g}" if abs(v) < 1000 else f"{v:,.0f}"


def plan_table(plan, envelope) -> pd.DataFrame:
    """The panel's table: key, quantity, value, unit, shown (formatted value)."""
    rows = []
    c = envelope.cslo
    for key, name, v in (("cslo_estimate", "C_SLO estimate (tested system)", c.estimate),
                         ("cslo_lower_bound", "C_SLO lower bound (tested system)", c.lower_bound)):
        rows.append({"key": key, "quantity": name, "value": _num(v), "unit": "req/s"})
    for key in TABLE_KEYS:
        try:
            it = plan.item(key)
        except KeyError:
            continue
        rows.append({"key": key, "quantity": it.name, "value": float(it.value), "unit": it.unit})
    rows.append({"key": "checks", "quantity": "all plan checks pass",
                 "value": 1.0 if plan.ok else 0.0, "unit": ""})
    df = pd.DataFrame(rows, columns=["key", "quantity", "value", "unit"])
    df["shown"] = [("yes" if r.value else "NO") if r.key == "checks" else _fmt_value(r.value, r.unit)
                   for r in df.itertuples()]
    return df


def _num(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def whatif_figure(plan, envelope, params: WhatIfParams) -> go.Figure:
    """Left: attainment vs offered rate with the target, the C_SLO estimate, interval and lower
    bound (the envelope's own figure, legend included). Right: replica groups by reason."""
    fig = make_subplots(rows=1, cols=2, column_widths=[0.6, 0.4], horizontal_spacing=0.1,
                        subplot_titles=("SLO attainment vs offered rate", "Replica groups at peak"))
    env_fig = envelope.figure()
    for tr in env_fig.data:
        fig.add_trace(tr, row=1, col=1)
    parts = [("traffic", "traffic_groups"), ("failure", "failure_reserve_groups"),
             ("rollout", "rollout_overlap_groups"), ("cold start", "cold_start_reserve_groups"),
             ("warm floor", "warm_floor_topup_groups")]
    x, y = [], []
    for label, key in parts:
        try:
            y.append(float(plan.value(key)))
            x.append(label)
        except KeyError:
            continue
    x.append("total")
    y.append(float(plan.value("total_groups")))
    fig.add_trace(go.Waterfall(x=x, y=y, measure=["relative"] * (len(x) - 1) + ["total"],
                               text=[f"{v:.0f}" for v in y], textposition="outside",
                               showlegend=False, name="groups"), row=1, col=2)
    fig.update_xaxes(title_text=envelope.x_label, row=1, col=1)
    ya = env_fig.layout.yaxis
    fig.update_yaxes(title_text="SLO attainment (stretched near 1)", tickvals=ya.tickvals, ticktext=ya.ticktext,
                     range=ya.range, row=1, col=1)
    fig.update_yaxes(title_text="replica groups", row=1, col=2)
    fig.update_layout(template="plotly_white", height=520, margin=dict(l=60, r=20, t=60, b=40),
                      legend=dict(orientation="h", y=-0.18, font=dict(size=11)))
    return fig


def quarters_view(plan) -> pd.DataFrame:
    """The plan by quarter as the panel shows it (dated)."""
    q = plan.quarters_frame()
    return q[["quarter", "start", "end", "peak_rps", "demand_rps", "groups", "gpus", "billed_gpus", "nodes",
              "cost_usd_per_month", "cost_usd_per_quarter", "cost_usd_per_1k_good_requests"]]


def whatif_state(model: WhatIfModel, params: WhatIfParams, *, progress=None) -> WhatIfState:
    """Pure re-plan for one control position: the envelope at that SLO (exact), make_plan, the
    table, the quarters and the figure. Raises :class:`NoCapacity` (plain words) when the
    settings give no usable capacity."""
    from ..plan import capacity_from_envelope, make_plan

    t0 = time.perf_counter()
    if params.policy not in POLICY_LABELS:
        raise SpecError(f"unknown failure policy {params.policy!r}", field="policy",
                        fix="one of " + ", ".join(POLICY_LABELS))
    slo = params.slo(model.slo)
    env = model.envelope_for(slo, progress=progress)
    spec = model.spec.with_(peak_rps=params.peak_rps, uncertainty=params.uncertainty,
                            policy=params.policy,
                            price_usd_per_gpu_hour=params.price_usd_per_gpu_hour,
                            capacity_use=params.capacity_use, slo=slo)
    replicas = model.study.manifest.replicas
    try:
        cap = capacity_from_envelope(env, spec, replicas=replicas, study_name=model.study.name)
    except SpecError:
        raise NoCapacity(model.no_capacity_message(params)) from None
    plan = make_plan(spec, capacity=cap, study=model.study, facts=model.facts(slo), slo=slo)
    table = plan_table(plan, env)
    fig = whatif_figure(plan, env, params)
    return WhatIfState(params=params, table=table, figure=fig, plan=plan, envelope=env,
                       seconds=time.perf_counter() - t0, quarters=quarters_view(plan))


def scenario_spec(model: WhatIfModel, params: WhatIfParams):
    """The plan spec of a control position (what ``capplan plan STUDY --spec`` needs to give
    the same plan)."""
    slo = params.slo(model.slo)
    return model.spec.with_(peak_rps=params.peak_rps, uncertainty=params.uncertainty, policy=params.policy,
                            price_usd_per_gpu_hour=params.price_usd_per_gpu_hour,
                            capacity_use=params.capacity_use, slo=slo)


def spec_yaml(spec) -> str:
    """A plan spec as YAML that ``load_plan_spec`` reads back to the same spec."""
    import yaml

    def clean(d):
        if isinstance(d, dict):
            return {k: clean(v) for k, v in d.items() if v is not None}
        return d

    return ("# capplan plan spec saved from the what-if panel\n"
            + yaml.safe_dump(clean(spec.to_dict()), sort_keys=False, allow_unicode=True))


def save_scenario(model: WhatIfModel, state: WhatIfState, folder, *, time_iso: str | None = None) -> dict:
    """Write the scenario on screen: ``plan.yaml`` (the spec; ``capplan plan STUDY --spec
    plan.yaml`` gives the same plan) and the finance export (``plan.xlsx`` + CSVs). Returns
    the paths."""
    from ..export import export_plan
    from ..io import write_text_atomic

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    spec = scenario_spec(model, state.params)
    write_text_atomic(folder / "plan.yaml", spec_yaml(spec))
    export_plan(state.plan, folder / "export", time=time_iso, study_hash=model.study_hash,
                parameters={"source": "what-if panel", "study": str(model.study.root)})
    return {"spec": folder / "plan.yaml", "xlsx": folder / "export" / "plan.xlsx", "folder": folder}
