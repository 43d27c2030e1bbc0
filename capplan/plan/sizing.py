"""The sizing rule of a plan: whole replica groups for one planned demand, reserves included.

Sizing (all in whole replica groups; D = λ_peak·(1+u), C = C_SLO per group):

1. traffic groups            N1 = ⌈D / C⌉
2. failure reserve           N2 = smallest N ≥ N1 with (N − L(N))·C ≥ D, L(N) = groups lost
                              with the largest allowed failure domain (groups spread evenly over
                              zones, then evenly over the nodes of a zone; a group spanning
                              several nodes is lost with any of them)
3. rollout overlap           N3 = smallest N ≥ N2 + r with (N − L(N) − r)·C ≥ D, r = groups out
                              of service in the worst rollout step = max(max_unavailable,
                              canary_groups − max_surge); surge groups are temporary extra GPUs
4. cold-start reserve        N4 = smallest N ≥ N3 + ⌈b·T / C⌉ with (N − L(N) − r)·C ≥ D + b·T,
                              b = burst growth (req/s per s), T = replica ready time (sum of parts)
5. warm floor                N  = max(N4, warm floor)

Each later step keeps the earlier conditions (a domain may fail during a rollout while demand
grows), so adding groups that enlarge the largest zone is accounted for.

:func:`size` is called for the plan's first quarter and for each later one; ``capplan.plan.
fleet_steps`` and ``capplan.plan.sensitivity`` call it again to find where the plan changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import SpecError
from .spec import FailureSpec, PlanSpec

#: relative tolerance when dividing rates (380/47.5 must be 8, not 8.000000001)
EPS = 1e-9
_MAX_GROUPS = 10_000_000


@dataclass(frozen=True)
class Sizing:
    """The integer sizing of one demand (shared by the main plan and each quarter)."""

    demand_rps: float
    need_traffic: int
    n_failure: int
    n_rollout: int
    n_cold: int
    total: int
    loss_failure: int
    loss_rollout: int
    nodes: int
    zone_groups: tuple[int, ...]


def ceil_div(a: float, b: float) -> int:
    """⌈a/b⌉ tolerant to float noise (380/47.5 → 8)."""
    q = a / b
    return int(math.ceil(q - EPS * max(1.0, abs(q))))


def zone_spread(groups: int, zones: int) -> tuple[int, ...]:
    """Groups spread evenly over zones; the first ``groups mod zones`` zones hold one more."""
    base, extra = divmod(groups, zones)
    return tuple(base + (1 if i < extra else 0) for i in range(zones))


def nodes_for(groups_in_zone: int, gpus_per_group: int, gpus_per_node: int) -> int:
    """Nodes of one zone. Groups that fit on a node share nodes (⌊n/g⌋ per node); a group
    larger than a node takes ⌈g/n⌉ nodes of its own."""
    if groups_in_zone <= 0:
        return 0
    if gpus_per_group <= gpus_per_node:
        return -(-groups_in_zone // (gpus_per_node // gpus_per_group))
    return groups_in_zone * -(-gpus_per_group // gpus_per_node)


def failure_loss(groups: int, failure: FailureSpec, gpus_per_group: int, gpus_per_node: int) -> int:
    """Groups lost with the largest allowed failure domain when ``groups`` are spread evenly
    over the zones and, within the largest zone, evenly over its nodes."""
    if groups <= 0 or failure.policy == "none":
        return 0
    if failure.policy == "n_plus_k":
        return min(failure.k, groups)
    z = len(failure.zones)
    gmax = -(-groups // z)
    if failure.policy == "zone":
        return gmax
    if gpus_per_group > gpus_per_node:  # spans nodes exclusively: one node takes one group
        return 1
    nodes = nodes_for(gmax, gpus_per_group, gpus_per_node)
    return -(-gmax // nodes)


def size(demand_rps: float, capacity_rps: float, spec: PlanSpec, gpus_per_group: int) -> Sizing:
    """Integer sizing for one planned demand D (req/s, uncertainty included)."""
    n = spec.group.gpus_per_node
    fail, roll, auto = spec.failure, spec.rollout, spec.autoscaling
    r = roll.loss_groups
    burst = auto.burst_growth_rps_per_s * auto.ready_s

    def loss(N):
        return failure_loss(N, fail, gpus_per_group, n)

    def smallest(start, need):
        N = max(start, need)
        if fail.policy == "zone":  # N − ⌈N/Z⌉ = ⌊N(Z−1)/Z⌋ ≥ need  ⇔  N ≥ need·Z/(Z−1)
            z = len(fail.zones)
            N = max(N, -(-need * z // (z - 1)) - 1)
        while N - loss(N) < need:
            N += 1
            if N > _MAX_GROUPS:
                raise SpecError("the plan needs more than 10 million replica groups", field="demand.peak_rps",
                                fix="check the peak rate and the capacity units (req/s per group)")
        return N

    need = ceil_div(demand_rps, capacity_rps)
    n1 = need
    n2 = smallest(n1, need)
    n3 = smallest(n2 + r, need + r)
    cold = ceil_div(burst, capacity_rps) if burst > 0 else 0
    n4 = smallest(n3 + cold, ceil_div(demand_rps + burst, capacity_rps) + r)
    total = max(n4, auto.warm_floor_groups)
    zg = zone_spread(total, len(fail.zones))
    nodes = sum(nodes_for(g, gpus_per_group, n) for g in zg)
    return Sizing(demand_rps=demand_rps, need_traffic=n1, n_failure=n2, n_rollout=n3, n_cold=n4, total=total,
                  loss_failure=loss(total), loss_rollout=r, nodes=nodes, zone_groups=zg)
