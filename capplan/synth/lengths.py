"""Joint distribution of (input, output) token lengths.

``lognormal``: log-lengths are bivariate normal with correlation ``rho`` (so long prompts tend
to come with long answers when rho > 0), each marginal given by its median and log-sd ``sigma``,
rounded and clipped to [min, max]. ``fixed``: every request has the same lengths (benchmarks).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import SpecError


@dataclass(frozen=True)
class Marginal:
    median: float
    sigma: float
    min: int = 1
    max: int = 1_000_000


@dataclass(frozen=True)
class LengthDist:
    kind: str = "lognormal"  # "lognormal" | "fixed"
    input: Marginal = Marginal(800, 0.8, 16, 8192)
    output: Marginal = Marginal(160, 0.7, 1, 1024)
    rho: float = 0.3

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``n`` (input_tokens, output_tokens) pairs as int64 arrays."""
        if self.kind == "fixed":
            return (np.full(n, int(self.input.median), np.int64), np.full(n, int(self.output.median), np.int64))
        z1 = rng.standard_normal(n)
        z2 = self.rho * z1 + np.sqrt(1.0 - self.rho ** 2) * rng.standard_normal(n)
        li = np.exp(np.log(self.input.median) + self.input.sigma * z1)
        lo = np.exp(np.log(self.output.median) + self.output.sigma * z2)
        inp = np.clip(np.rint(li), self.input.min, self.input.max).astype(np.int64)
        out = np.clip(np.rint(lo), self.output.min, self.output.max).astype(np.int64)
        return inp, out

    @property
    def max_total(self) -> int:
        return int(self.input.max if self.kind != "fixed" else self.input.median) + int(
            self.output.max if self.kind != "fixed" else self.output.median)

    def to_dict(self) -> dict:
        if self.kind == "fixed":
            return {"kind": "fixed", "input": int(self.input.median), "output": int(self.output.median)}
        m = lambda x: {"median": x.median, "sigma": x.sigma, "min": x.min, "max": x.max}  # noqa: E731
        return {"kind": "lognormal", "input": m(self.input), "output": m(self.output), "rho": self.rho}

    @classmethod
    def from_dict(cls, d: dict, field: str = "workload.lengths") -> "LengthDist":
        if not isinstance(d, dict):
            raise SpecError("lengths must be a mapping", field=field,
                            fix="e.g. lengths: {kind: fixed, input: 512, output: 200}")
        kind = d.get("kind", "lognormal")
        if kind == "fixed":
            unknown = sorted(set(d) - {"kind", "input", "output"})
            if unknown:
                raise SpecError(f"unknown key(s) {', '.join(unknown)}", field=field, fix="fixed lengths take input, output")
            try:
                i, o = int(d.get("input", 512)), int(d.get("output", 200))
            except (TypeError, ValueError):
                raise SpecError("fixed lengths must be integers", field=field) from None
            if i < 1 or o < 1:
                raise SpecError("fixed lengths must be ≥ 1", field=field)
            return cls("fixed", Marginal(i, 0.0, i, i), Marginal(o, 0.0, o, o), 0.0)
        if kind != "lognormal":
            raise SpecError(f"unknown lengths kind {kind!r}", field=f"{field}.kind", fix="lognormal or fixed")
        unknown = sorted(set(d) - {"kind", "input", "output", "rho"})
        if unknown:
            raise SpecError(f"unknown key(s) {', '.join(unknown)}", field=field,
                            fix="lognormal lengths take input, output (each median, sigma, min, max) and rho")
        base = cls()

        def marg(key: str, dflt: Marginal) -> Marginal:
            m = d.get(key, {}) or {}
            if not isinstance(m, dict):
                raise SpecError(f"{key} must be a mapping", field=f"{field}.{key}",
                                fix="e.g. {median: 800, sigma: 0.8, min: 16, max: 8192}")
            bad = sorted(set(m) - {"median", "sigma", "min", "max"})
            if bad:
                raise SpecError(f"unknown key(s) {', '.join(bad)}", field=f"{field}.{key}",
                                fix="median, sigma, min, max")
            try:
                out = Marginal(float(m.get("median", dflt.median)), float(m.get("sigma", dflt.sigma)),
                               int(m.get("min", dflt.min)), int(m.get("max", dflt.max)))
            except (TypeError, ValueError):
                raise SpecError("length parameters must be numbers", field=f"{field}.{key}") from None
            if not (out.median > 0) or out.sigma < 0 or out.min < 1 or out.max < out.min:
                raise SpecError("need median > 0, sigma ≥ 0, 1 ≤ min ≤ max", field=f"{field}.{key}",
                                example=str(m))
            return out

        try:
            rho = float(d.get("rho", base.rho))
        except (TypeError, ValueError):
            raise SpecError("rho must be a number", field=f"{field}.rho") from None
        if not (-1.0 < rho < 1.0):
            raise SpecError(f"rho must lie in (-1, 1), got {rho}", field=f"{field}.rho")
        return cls("lognormal", marg("input", base.input), marg("output", base.output), rho)
