"""Joint distribution of (input, output) token lengths.

``lognormal``: log-lengths are bivariate normal with correlation ``rho`` (so long prompts tend
to come with long answers when rho > 0), each marginal given by its median and log-sd ``sigma``,
rounded and clipped to [min, max]. ``fixed``: every request has the same lengths (benchmarks).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import spec as S


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
        """Check a lengths mapping with the spec kit (unknown keys, numbers, ranges)."""
        d = S.mapping(d, field, known=("kind", "input", "output", "rho"),
                      example="{kind: fixed, input: 512, output: 200}")
        kind = S.choice(d.get("kind", "lognormal"), S.join(field, "kind"), ("lognormal", "fixed"))
        if kind == "fixed":
            S.unknown_keys(d, ("kind", "input", "output"), field)
            i = S.number(d.get("input", 512), S.join(field, "input"), integer=True, minimum=1)
            o = S.number(d.get("output", 200), S.join(field, "output"), integer=True, minimum=1)
            return cls("fixed", Marginal(i, 0.0, i, i), Marginal(o, 0.0, o, o), 0.0)
        base = cls()

        def marg(key: str, dflt: Marginal) -> Marginal:
            f = S.join(field, key)
            m = S.mapping(d.get(key), f, known=("median", "sigma", "min", "max"),
                          example="{median: 800, sigma: 0.8, min: 16, max: 8192}")
            out = Marginal(S.number(m.get("median", dflt.median), S.join(f, "median"), above=0.0),
                           S.number(m.get("sigma", dflt.sigma), S.join(f, "sigma"), minimum=0.0),
                           S.number(m.get("min", dflt.min), S.join(f, "min"), integer=True, minimum=1),
                           S.number(m.get("max", dflt.max), S.join(f, "max"), integer=True, minimum=1))
            if out.max < out.min:
                S.fail(S.join(f, "max"), f"{f}: max ({out.max}) is below min ({out.min})",
                       "make max ≥ min", example=str(m))
            return out

        rho = S.number(d.get("rho", base.rho), S.join(field, "rho"), above=-1.0, below=1.0)
        return cls("lognormal", marg("input", base.input), marg("output", base.output), rho)
