"""Clients that retry (docs/timeline.md "Client retries"): how many times, after what backoff,
and within what budget — so a failure or a rollout shows the load its retries add.

A request whose attempt fails — lost with a failed replica, routed to one whose routes are
not yet removed, cut at a drain deadline, or rejected by a full queue or an admission policy —
is sent again by its client when all of these hold:

- it has been retried fewer than ``max_retries`` times;
- the **retry budget** allows it: over the last ``budget_window_s`` the clients have decided at
  most ``budget_min_retries + budget × first attempts`` retries (a Finagle / Envoy retry
  budget: retries stay a fraction of the requests, so a retry storm cannot multiply the load);
  ``budget`` None: no budget;
- its deadline has not passed (a retry keeps the request's deadline: the client's timeout
  covers all attempts, as a gRPC deadline does).

Retry n (1, 2, …) is sent ``backoff_n`` after the client saw the failure, where
backoff_n = min(max_backoff_s, backoff_s · multiplier^(n−1)) and, with ``jitter``,
``full``: uniform on [0, backoff_n] (the "full jitter" of exponential backoff), ``equal``:
backoff_n/2 + uniform on [0, backoff_n/2], ``none``: backoff_n. The uniform draws come from
one generator seeded with ``seed``, in the order the failures are seen, so a run is
reproducible. A retry starts over (the tokens of the failed attempt are dropped).

**Retry amplification** = attempts / original requests = (first attempts + retries sent) /
first attempts: 1 without retries; the load the clients put on the fleet per request they
wanted served.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from .. import spec as S
from ..errors import SpecError

NS = 1_000_000_000
JITTERS = ("full", "equal", "none")
RETRY_KEYS = ("max_retries", "backoff_s", "multiplier", "max_backoff_s", "jitter", "budget",
              "budget_window_s", "budget_min_retries", "seed")


@dataclass(frozen=True)
class RetryPolicy:
    """The clients' retry policy (module docstring)."""

    max_retries: int = 3
    backoff_s: float = 0.5
    multiplier: float = 2.0
    max_backoff_s: float = 30.0
    jitter: str = "full"
    budget: float | None = 0.2
    budget_window_s: float = 10.0
    budget_min_retries: int = 3
    seed: int = 0

    def __post_init__(self):
        for name, ok in (("max_retries", self.max_retries >= 0),
                         ("backoff_s", self.backoff_s >= 0),
                         ("multiplier", self.multiplier >= 1),
                         ("max_backoff_s", self.max_backoff_s >= self.backoff_s),
                         ("jitter", self.jitter in JITTERS),
                         ("budget", self.budget is None or self.budget >= 0),
                         ("budget_window_s", self.budget_window_s > 0),
                         ("budget_min_retries", self.budget_min_retries >= 0)):
            if not ok:
                raise SpecError(f"retry.{name} is out of range: {getattr(self, name)!r}",
                                field=f"retry.{name}", fix="see docs/timeline.md \"Client retries\"")

    def backoff_ns(self, n: int, u: float) -> int:
        """The wait before retry ``n`` (1-based), ``u`` a uniform draw on [0, 1)."""
        b = min(self.max_backoff_s, self.backoff_s * self.multiplier ** (n - 1))
        if self.jitter == "full":
            b *= u
        elif self.jitter == "equal":
            b = b / 2 + b / 2 * u
        return int(round(b * NS))

    def describe(self) -> str:
        budget = "no budget" if self.budget is None else (
            f"budget {self.budget:g} × first attempts + {self.budget_min_retries} per "
            f"{self.budget_window_s:g} s")
        return (f"clients retry up to {self.max_retries}× (backoff {self.backoff_s:g} s × "
                f"{self.multiplier:g}^(n−1), at most {self.max_backoff_s:g} s, {self.jitter} jitter, "
                f"seed {self.seed}; {budget})")


class Retrier:
    """A run's clients under one policy: decides each retry and counts attempts."""

    def __init__(self, policy: RetryPolicy):
        self.policy = policy
        self.rng = np.random.default_rng(policy.seed)
        self.firsts: deque = deque()  # times of first attempts in the budget window
        self.decided: deque = deque()  # times of retries decided in it
        self.first_attempts = 0
        self.retries_sent = 0
        self.refused_budget = 0
        self.exhausted = 0

    def first(self, now_ns: int) -> None:
        """A request's first attempt was sent."""
        self.first_attempts += 1
        if self.policy.budget is not None:
            self.firsts.append(now_ns)

    def sent(self) -> None:
        """A retry went out (it may still have been decided but never sent: past the end)."""
        self.retries_sent += 1

    def decide(self, now_ns: int, retries_so_far: int) -> int | None:
        """The backoff (ns) of the next retry of a request that failed at ``now_ns`` after
        ``retries_so_far`` retries, or None when the count or the budget forbids one."""
        p = self.policy
        if retries_so_far >= p.max_retries:
            self.exhausted += 1
            return None
        if p.budget is not None:
            cut = now_ns - int(round(p.budget_window_s * NS))
            while self.firsts and self.firsts[0] <= cut:
                self.firsts.popleft()
            while self.decided and self.decided[0] <= cut:
                self.decided.popleft()
            if len(self.decided) + 1 > p.budget_min_retries + p.budget * len(self.firsts) + 1e-9:
                self.refused_budget += 1
                return None
            self.decided.append(now_ns)
        u = float(self.rng.random()) if p.jitter != "none" else 0.0
        return p.backoff_ns(retries_so_far + 1, u)

    def stats(self) -> dict:
        n = self.first_attempts
        return {"first_attempts": n, "retries_sent": self.retries_sent,
                "retry_amplification": (n + self.retries_sent) / n if n else 1.0,
                "retries_refused_budget": self.refused_budget, "retries_exhausted": self.exhausted}


def parse_retry(raw, fld: str) -> RetryPolicy:
    """A retry policy from a scenario mapping, checked with the spec kit (an unknown key or a
    bad value names the field)."""
    d = S.mapping(raw, fld, known=RETRY_KEYS, optional=False,
                  example="{max_retries: 3, backoff_s: 0.5, jitter: full, budget: 0.2}")
    num = lambda k, default, **kw: S.number(d.get(k, default), S.join(fld, k), **kw)  # noqa: E731
    base = S.duration_s(d.get("backoff_s", 0.5), S.join(fld, "backoff_s"))
    cap = S.duration_s(d.get("max_backoff_s", max(30.0, base)), S.join(fld, "max_backoff_s"))
    if cap < base:
        S.fail(S.join(fld, "max_backoff_s"), f"{fld}.max_backoff_s ({cap:g} s) is below "
               f"backoff_s ({base:g} s)", "max_backoff_s: 30")
    budget = d.get("budget", 0.2)
    return RetryPolicy(
        max_retries=int(num("max_retries", 3, integer=True, minimum=0, example="3")),
        backoff_s=base, multiplier=num("multiplier", 2.0, minimum=1.0, example="2"),
        max_backoff_s=cap, jitter=S.choice(d.get("jitter", "full"), S.join(fld, "jitter"), JITTERS),
        budget=None if budget is None or budget is False else
        S.number(budget, S.join(fld, "budget"), minimum=0.0, example="0.2"),
        budget_window_s=S.duration_s(d.get("budget_window_s", 10.0), S.join(fld, "budget_window_s"),
                                     above=0.0),
        budget_min_retries=int(num("budget_min_retries", 3, integer=True, minimum=0, example="3")),
        seed=int(num("seed", 0, integer=True, minimum=0, example="0")))


__all__ = ["RetryPolicy", "Retrier", "parse_retry", "RETRY_KEYS"]
