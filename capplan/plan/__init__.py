"""The plan: from a capacity (C_SLO) and a demand to replica groups, GPUs, nodes, cost and energy.

``from capplan.plan import make_plan, load_plan_spec, Plan, …`` gives the names a planner uses;
each module of the package has one job:

- ``spec``: the frozen, validated plan specification (``load_plan_spec``, ``PlanSpec.with_``);
- ``inputs``: the inputs resolved once — given, else the spec's, else capplan's default, each
  saying which (``resolve_inputs``); the command line, the report, the notebooks and the mix page;
- ``make``: the plan put together per quarter (``make_plan``), the slow parts prepared once
  (``prepare_plan``), the plan on the capacity's other numbers (``compare_numbers``);
- ``capacity``: the C_SLO per group a plan stands on (a number, an envelope, SLO classes, the
  target mix reweighted or through the twin) and its honesty verdict;
- ``sizing``: the sizing rule, whole replica groups with failure, rollout and cold-start reserves;
- ``items``: the plan's line items (formula and inputs each) and checks;
- ``result``: ``Plan`` and its parts, and how it prints, tabulates and draws itself;
- ``text``: the plan's words and tables (assumptions, months, years, what the plan is);
- ``bounds``: work units, KV memory and power bounds as line items and checks;
- ``contract``: the capacity contract and the chargeback per tenant / SLO class;
- ``periods``: the dates of a plan's quarters, months and years;
- ``forecast``: quarterly peak demand from a history, and its back-test;
- ``fleet_steps``: the quarters as dated fleet steps;
- ``sensitivity``: the capacity range over which the plan holds, and the plan record;
- ``candidates``: the same demand planned on several serving configurations;
- ``dynamics``: the plan's failure, rollout and cold-start checks simulated on a twin.

Only the names below are imported with the package; ``dynamics``, ``sensitivity``,
``fleet_steps``, ``forecast`` and ``candidates`` are imported by their own path
(``from capplan.plan.dynamics import simulate_plan``) so that a plan stays light.
"""

from __future__ import annotations

from .capacity import (CapacityInfo, capacity_at_mix, capacity_at_twin, capacity_for_classes,
                       capacity_from_envelope, resolve_capacity, twin_bound)
from .make import burst_inputs_for, compare_numbers, gpus_per_group, make_plan, prepare_plan
from .result import SUMMARY_KEYS, Check, LineItem, Plan, QuarterPlan
from .sizing import Sizing, failure_loss, nodes_for, size, zone_spread
from .spec import (BILLING, CAPACITY_USES, POLICIES, READY_PARTS, AutoscalingSpec, CapacitySpec, DemandSpec,
                   FailureSpec, GroupSpec, PlanSpec, PriceSpec, RolloutSpec, load_plan_spec)
from .text import policy_text

__all__ = [
    "AutoscalingSpec", "BILLING", "CAPACITY_USES", "CapacityInfo", "CapacitySpec", "Check", "DemandSpec",
    "FailureSpec", "GroupSpec", "LineItem", "POLICIES", "Plan", "PlanSpec", "PriceSpec", "QuarterPlan",
    "READY_PARTS", "RolloutSpec", "SUMMARY_KEYS", "Sizing", "burst_inputs_for", "capacity_at_mix",
    "capacity_at_twin", "capacity_for_classes", "capacity_from_envelope", "compare_numbers", "failure_loss",
    "gpus_per_group", "load_plan_spec", "make_plan", "nodes_for", "policy_text", "prepare_plan",
    "resolve_capacity", "size", "twin_bound", "zone_spread",
]
