"""The plan's bounds beyond request rate: work units (tokens), the KV-memory bound and power
(docs/mix.md, "Work units", "KV memory", "Power").

Pure functions that return plain rows, so :mod:`capplan.plan` turns them into its line items
and checks without this module knowing those classes:

- items:  ``(key, name, value, unit, formula, inputs)``
- checks: ``(key, sentence, ok)``

Work units: capacity is measured in requests, demand is often forecast in tokens. Token goodput
at the SLO is C × good fraction × tokens per SLO-meeting request (C: the capacity per replica
group; prefill = input tokens, decode = output tokens), read from the study at the capacity
point; a daily token volume is turned into requests with a stated tokens-per-request assumption.
"""

from __future__ import annotations

import math
from typing import Any

from ..contract import pct_label
from ..kv import Catalogue, KVBudget, kv_bound_check, kv_budget, load_catalogue

SECONDS_PER_DAY = 86400.0
J_PER_WH = 3600.0


# ----------------------------------------------------------------------------- work units


def tokens_per_request(demand, facts) -> dict[str, tuple[float | None, str]]:
    """Input and output tokens per request assumed for a token demand: the spec's values, else
    the tested mix's means (ok requests of the whole study), else unknown."""
    out = {}
    for kind in ("input", "output"):
        given = getattr(demand, f"{kind}_tokens_per_request")
        mean = getattr(facts, f"mean_{kind}_tokens", None) if facts is not None else None
        if given is not None:
            out[kind] = (float(given), f"demand.{kind}_tokens_per_request from the spec")
        elif mean:
            out[kind] = (float(mean), f"mean {kind} tokens per request of the study's tested mix "
                                      "(ok requests, all levels)")
        else:
            out[kind] = (None, "unknown")
    return out


def peak_from_tokens(demand, facts) -> tuple[float, str, dict, list[str]]:
    """Peak offered rate (req/s) from a daily token volume: requests/day = the larger of
    (input tokens/day ÷ input tokens per request) and (output tokens/day ÷ output tokens per
    request); λ_peak = requests/day ÷ 86 400 s ÷ mean_to_peak. Returns (λ_peak, formula,
    inputs, notes)."""
    from ..errors import SpecError

    tpr = tokens_per_request(demand, facts)
    vol = dict(demand.tokens_per_day)
    per_day, inputs = {}, {}
    for kind, tokens in vol.items():
        t, src = tpr[kind]
        if t is None:
            raise SpecError(f"demand.tokens_per_day.{kind} needs {kind} tokens per request, and there is "
                            "no study to read them from", field=f"demand.{kind}_tokens_per_request",
                            fix=f"add {kind}_tokens_per_request: {1200 if kind == 'input' else 250} to demand, "
                                "or plan with a study")
        per_day[kind] = tokens / t
        inputs[f"{kind}_tokens_per_day"] = tokens
        inputs[f"{kind}_tokens_per_request"] = t
        inputs[f"{kind}_tokens_per_request_source"] = src
    binding = max(per_day, key=per_day.get)
    req_day = per_day[binding]
    mtp = float(demand.mean_to_peak)
    peak = req_day / SECONDS_PER_DAY / mtp
    inputs.update({"requests_per_day": req_day, "binding": binding, "mean_to_peak": mtp})
    formula = ("requests/day ÷ 86 400 s ÷ mean_to_peak, requests/day = max over the token kinds given of "
               "tokens/day ÷ tokens per request (" + binding + " tokens bind)")
    notes = [f"demand in tokens: {req_day:,.0f} requests/day from {binding} tokens at "
             f"{inputs[binding + '_tokens_per_request']:.4g} tokens per request "
             f"({inputs[binding + '_tokens_per_request_source']}); if production's tokens per request "
             "differ from the tested mix, C_SLO in req/s does not carry over — reweight the study to "
             "the production mix (docs/mix.md)"]
    if len(per_day) == 2 and per_day["input"] > 0:
        ratio = per_day["output"] / per_day["input"]
        if abs(ratio - 1) > 0.1:
            notes.append(f"the token volumes imply different request counts (output ÷ input = {ratio:.3g}): "
                         "the forecast's input/output ratio differs from the tokens-per-request assumption; "
                         f"the larger ({binding}) is planned")
    return peak, formula, inputs, notes


def token_items(*, capacity_rps: float, groups: int, facts_at_capacity, facts_at_peak, peak_rps: float,
                pue: float) -> tuple[list[tuple], list[str]]:
    """Token goodput per group at C_SLO and energy per 1 000 tokens at the operating point."""
    items, notes = [], []
    fc = facts_at_capacity
    if fc is not None and fc.good_input_tokens_per_good_request:
        good_rps = capacity_rps * fc.good_fraction
        for kind, per, name in (("input", fc.good_input_tokens_per_good_request, "prefill"),
                                ("output", fc.good_output_tokens_per_good_request, "decode")):
            tps = good_rps * per
            items.append((f"{name}_tokens_per_s_per_group", f"{name} token goodput per group at C_SLO",
                          tps, "tokens/s",
                          f"C × good fraction at C_SLO × {kind} tokens per SLO-meeting request (C: "
                          "capacity per replica group)",
                          {"C": capacity_rps, "good_fraction": fc.good_fraction,
                           f"{kind}_tokens_per_good_request": per, "read": fc.how}))
            items.append((f"{name}_tokens_per_s_fleet", f"fleet {name} token goodput at C_SLO", tps * groups,
                          "tokens/s", f"N × {name} token goodput per group",
                          {"N": groups, "per_group": tps}))
    elif fc is not None:
        notes.append("token goodput not computed: no SLO-meeting request at the capacity point")
    fa = facts_at_peak
    if fa is not None and fa.energy_j_per_good_request is not None:
        wh = fa.energy_j_per_good_request * pue / J_PER_WH
        tin, tout = fa.good_input_tokens_per_good_request, fa.good_output_tokens_per_good_request
        for key, name, tok in (("energy_wh_per_1k_input_tokens", "energy per 1 000 input tokens", tin),
                               ("energy_wh_per_1k_output_tokens", "energy per 1 000 output tokens", tout),
                               ("energy_wh_per_1k_tokens", "energy per 1 000 tokens (input + output)", tin + tout)):
            if tok:
                items.append((key, name + " (facility)", wh / tok * 1000.0, "Wh",
                              "energy per SLO-meeting request ÷ its tokens × 1 000 (all the energy over "
                              "these tokens only: the three are alternative views, not parts to add)",
                              {"energy_wh_per_good_request": wh, "tokens_per_good_request": tok,
                               "read": fa.how}))
    return items, notes


# ----------------------------------------------------------------------------- KV memory


def _catalogue(spec) -> Catalogue:
    return load_catalogue(spec.model.catalogue)


def _pick(name: str | None, system_name: str | None, has) -> tuple[str | None, str]:
    if name is not None:
        return name, "spec"
    if system_name is not None and has(system_name):
        return system_name, "study system"
    return None, ""


def kv_items(spec, *, g: int, capacity_rps: float, facts, facts_at_capacity,
             system: dict | None) -> tuple[list[tuple], list[tuple], list[str], KVBudget | None]:
    """KV line items and the KV-bound check (docs/mix.md, "KV memory"). The model and GPU come
    from ``model:`` in the spec, else from the study's ``system`` when the catalogue lists them;
    the context length from ``model.context_tokens``, else a high quantile (``context_quantile``,
    p99) of the tested mix's input + output tokens per request, rounded up; with neither, no KV
    number at all (a note says why)."""
    m = spec.model
    system = system or {}
    if m.name is None and m.gpu is None and m.context_tokens is None and not system:
        return [], [], [], None
    cat = _catalogue(spec)
    model, msrc = _pick(m.name, system.get("model"), cat.has_model)
    gpu, gsrc = _pick(m.gpu, system.get("gpu"), cat.has_gpu)
    if model is None or gpu is None:
        if m.name is not None or m.gpu is not None or m.context_tokens is not None:
            miss = " and ".join(x for x, v in (("model.name", model), ("model.gpu", gpu)) if v is None)
            return [], [], [f"KV memory not computed: {miss} not given and not found in the catalogue "
                             "from the study's system"], None
        return [], [], [], None
    notes = []
    ctx, ctx_src = m.context_tokens, "model.context_tokens (forecast)"
    if ctx is None:
        q = getattr(facts, "context_tokens_q", None)
        if q is not None and q >= 1:
            name = pct_label(facts.context_quantile)
            ctx = int(math.ceil(q - 1e-9))
            ctx_src = f"{name} of input + output tokens per ok request of the study's tested mix"
            notes.append(f"KV bound at the tested mix's {name} context ({ctx:,} tokens of input + output, "
                         f"mean {facts.mean_input_tokens + (facts.mean_output_tokens or 0):,.0f}); set "
                         "model.context_tokens to the forecast context length to check the plan against it")
        else:
            return [], [], ["KV memory not computed: no model.context_tokens and no ok request in the study "
                            "to read a context length from — set model.context_tokens to the forecast context "
                            "(input + output tokens) of the longest requests to be served"], None
    b = kv_budget(model, gpu, g, context_tokens=ctx, kv_dtype=m.kv_dtype,
                  weight_bytes_per_param=m.weight_bytes_per_param,
                  activation_reserve=m.activation_reserve, block_tokens=m.block_tokens, catalogue=cat)
    items = []
    for key, name, value, unit, formula, inputs in b.items():
        if key == "kv_max_sequences":
            inputs = dict(inputs, context_source=ctx_src)
        if key == "kv_bytes_per_token":
            inputs = dict(inputs, model_from=msrc, gpu_from=gsrc)
        items.append((key, name, value, unit, formula, inputs))
    checks = [("weights_fit", f"the weights of {b.model.name} ({b.weight_bytes / 2**30:,.1f} GiB) fit in "
               f"{b.usable_bytes / 2**30:,.1f} GiB of a replica ({g} × {b.gpu.name}, "
               f"{b.activation_reserve:.0%} kept for activations)", b.weights_fit)]
    notes += list(b.notes)
    w, wsrc = None, ""
    if facts_at_capacity is not None and facts_at_capacity.mean_e2e_s:
        w, wsrc = facts_at_capacity.mean_e2e_s, f"mean E2E of ok requests in the study, {facts_at_capacity.how}"
    elif m.mean_e2e_s is not None:
        w, wsrc = m.mean_e2e_s, "model.mean_e2e_s from the spec"
    if w is not None and b.weights_fit:
        chk = kv_bound_check(b, capacity_rps, w, wsrc)
        items.append(("kv_sequences_needed", "sequences in flight per replica at C_SLO", chk.needed_sequences,
                      "sequences", "C × mean time in system (Little's law; C: capacity per replica group)",
                      {"C": capacity_rps, "mean_e2e_s": w, "source": wsrc}))
        items.append(("kv_bound_rps_per_group", f"KV-bound rate per replica at {ctx:,} tokens of context",
                      chk.kv_bound_rps, "req/s", "max concurrent sequences ÷ mean time in system",
                      {"max_sequences": b.max_sequences, "mean_e2e_s": w}))
        checks.append(("kv_bound", chk.sentence(), not chk.kv_bound))
    elif b.weights_fit:
        notes.append("KV-bound check not done: no study to read the mean time in system from and no "
                     "model.mean_e2e_s")
    return items, checks, notes, b


# ----------------------------------------------------------------------------- power


def power_items(spec, *, g: int, nodes: int, facts, budget: KVBudget | None,
                system: dict | None) -> tuple[list[tuple], list[tuple], list[str]]:
    """Peak IT power of the plan, and the rack / row cap checks (docs/mix.md, "Power")."""
    p = spec.power
    n_node = spec.group.gpus_per_node
    notes: list[str] = []
    gpu_w, src = None, ""
    if p.gpu_peak_w is not None:
        gpu_w, src = p.gpu_peak_w, "power.gpu_peak_w from the spec"
    elif facts is not None and facts.max_power_w_per_gpu is not None:
        gpu_w, src = facts.max_power_w_per_gpu, "highest power sample of one GPU in the study"
    else:
        gpu = budget.gpu if budget is not None else None
        if gpu is None:
            name = spec.model.gpu or (system or {}).get("gpu")
            if name is not None:
                try:
                    cat = _catalogue(spec)
                    gpu = cat.gpu(name) if cat.has_gpu(name) else None
                except Exception:  # noqa: BLE001 — a missing catalogue only loses this estimate
                    gpu = None
        if gpu is not None and gpu.peak_power_w is not None:
            gpu_w, src = gpu.peak_power_w, f"board power limit of {gpu.name} (catalogue)"
    has_cap = p.rack_cap_kw is not None or p.row_cap_kw is not None
    if gpu_w is None:
        if has_cap:
            notes.append("power caps not checked: no GPU peak power (set power.gpu_peak_w, or model.gpu "
                         "to a catalogue GPU, or plan with a study that has power samples)")
        return [], [], notes
    node_kw = (n_node * gpu_w + p.node_overhead_w) / 1000.0
    peak_kw = nodes * node_kw
    surge_kw = spec.rollout.max_surge * g * gpu_w / 1000.0
    items = [
        ("gpu_peak_w", "peak power per GPU", gpu_w, "W", src, {}),
        ("node_peak_kw", "peak power per node (IT)", node_kw, "kW",
         "GPUs per node × peak power per GPU + node overhead", {"gpus_per_node": n_node, "gpu_peak_w": gpu_w,
                                                                "node_overhead_w": p.node_overhead_w}),
        ("peak_it_power_kw", "peak IT power of the plan", peak_kw, "kW",
         "nodes × peak power per node (every GPU at its peak at once: an upper bound)",
         {"nodes": nodes, "node_peak_kw": node_kw}),
        ("peak_it_power_rollout_kw", "peak IT power during a rollout", peak_kw + surge_kw, "kW",
         "peak IT power + max_surge × GPUs per group × peak power per GPU",
         {"peak_it_power_kw": peak_kw, "max_surge": spec.rollout.max_surge, "g": g, "gpu_peak_w": gpu_w}),
        ("peak_facility_power_kw", "peak facility power", (peak_kw + surge_kw) * spec.prices.pue, "kW",
         "peak IT power during a rollout × PUE", {"pue": spec.prices.pue}),
    ]
    if p.node_overhead_w == 0:
        notes.append("peak power counts GPU boards only (power.node_overhead_w = 0): add the CPUs, NICs "
                     "and fans of a node for a rack budget")
    checks = []
    if p.rack_cap_kw is not None:
        per_rack = min(p.nodes_per_rack, max(nodes, 1))
        racks = math.ceil(nodes / p.nodes_per_rack) if nodes else 0
        fit = int(p.rack_cap_kw // node_kw) if node_kw > 0 else p.nodes_per_rack
        items.append(("racks", "racks", float(racks), "racks", "⌈nodes / nodes_per_rack⌉",
                      {"nodes": nodes, "nodes_per_rack": p.nodes_per_rack}))
        ok = per_rack * node_kw <= p.rack_cap_kw * (1 + 1e-9)
        sent = (f"a full rack ({per_rack} nodes × {node_kw:.3g} kW = {per_rack * node_kw:.3g} kW) stays within "
                f"the rack power cap {p.rack_cap_kw:g} kW")
        if not ok:
            sent += (f" — it does not: at most {fit} node(s) per rack fit under the cap "
                     f"({math.ceil(nodes / max(fit, 1)) if fit else 'no'} racks)")
        checks.append(("rack_power", sent, ok))
    if p.row_cap_kw is not None:
        tot = peak_kw + surge_kw
        checks.append(("row_power", f"peak IT power during a rollout {tot:.4g} kW ≤ the row power cap "
                       f"{p.row_cap_kw:g} kW", tot <= p.row_cap_kw * (1 + 1e-9)))
    return items, checks, notes


def bounds(spec, *, g: int, capacity_rps: float, groups: int, nodes: int, facts, facts_at_peak,
           study_replicas: int, peak_rps: float, system: dict | None) -> dict[str, Any]:
    """Every extra line item, check and note of a plan: tokens, KV memory, power."""
    fc = facts.at(capacity_rps * (study_replicas or 1)) if facts is not None and facts.levels else None
    t_items, t_notes = token_items(capacity_rps=capacity_rps, groups=groups, facts_at_capacity=fc,
                                   facts_at_peak=facts_at_peak, peak_rps=peak_rps, pue=spec.prices.pue)
    k_items, k_checks, k_notes, budget = kv_items(spec, g=g, capacity_rps=capacity_rps, facts=facts,
                                                  facts_at_capacity=fc, system=system)
    p_items, p_checks, p_notes = power_items(spec, g=g, nodes=nodes, facts=facts, budget=budget,
                                             system=system)
    return {"items": t_items + k_items + p_items, "checks": k_checks + p_checks,
            "notes": t_notes + k_notes + p_notes, "kv": budget}
