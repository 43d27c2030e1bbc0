"""Joint distribution of (input, output) token lengths.

``lognormal``: log-lengths are bivariate normal with correlation ``rho`` (so long prompts tend
to come with long answers when rho > 0), each marginal given by its median and log-sd ``sigma``,
rounded and clipped to [min, max]. ``fixed``: every request has the same lengths (benchmarks).
``empirical``: a Gaussian copula over measured quantiles — each marginal is a quantile table
(``levels`` → tokens, linear between levels) and ``rho`` is the correlation of the normal scores,
so a twin can replay a measured length mix without assuming a parametric shape.
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
    kind: str = "lognormal"  # "lognormal" | "fixed" | "empirical"
    input: Marginal = Marginal(800, 0.8, 16, 8192)
    output: Marginal = Marginal(160, 0.7, 1, 1024)
    rho: float = 0.3
    levels: tuple[float, ...] = ()  # empirical: quantile levels, 0 … 1 increasing
    input_q: tuple[float, ...] = ()  # empirical: input tokens at each level
    output_q: tuple[float, ...] = ()  # empirical: output tokens at each level

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``n`` (input_tokens, output_tokens) pairs as int64 arrays."""
        if self.kind == "fixed":
            return (np.full(n, int(self.input.median), np.int64), np.full(n, int(self.output.median), np.int64))
        z1 = rng.standard_normal(n)
        z2 = self.rho * z1 + np.sqrt(1.0 - self.rho ** 2) * rng.standard_normal(n)
        if self.kind == "empirical":
            from scipy.special import ndtr

            lv = np.asarray(self.levels, float)
            inp = np.rint(np.interp(ndtr(z1), lv, np.asarray(self.input_q, float))).astype(np.int64)
            out = np.rint(np.interp(ndtr(z2), lv, np.asarray(self.output_q, float))).astype(np.int64)
            return np.maximum(inp, 1), np.maximum(out, 1)
        li = np.exp(np.log(self.input.median) + self.input.sigma * z1)
        lo = np.exp(np.log(self.output.median) + self.output.sigma * z2)
        inp = np.clip(np.rint(li), self.input.min, self.input.max).astype(np.int64)
        out = np.clip(np.rint(lo), self.output.min, self.output.max).astype(np.int64)
        return inp, out

    @property
    def max_total(self) -> int:
        return int(self.input.max if self.kind != "fixed" else self.input.median) + int(
            self.output.max if self.kind != "fixed" else self.output.median)

    @classmethod
    def empirical(cls, levels, input_q, output_q, rho: float, field: str = "workload.lengths") -> "LengthDist":
        """A quantile-table (Gaussian copula) distribution; checks the tables."""
        lv = tuple(float(x) for x in levels)
        iq = tuple(float(x) for x in input_q)
        oq = tuple(float(x) for x in output_q)
        if len(lv) < 2 or len(iq) != len(lv) or len(oq) != len(lv):
            S.fail(field, "empirical lengths need levels, input and output lists of the same length (≥ 2)",
                   "e.g. {kind: empirical, levels: [0, 0.5, 1], input: [16, 700, 6000], output: [4, 150, 1024], "
                   "rho: 0.3}")
        if lv[0] != 0.0 or lv[-1] != 1.0 or any(b <= a for a, b in zip(lv, lv[1:])):
            S.fail(S.join(field, "levels"), "empirical length levels must increase from 0 to 1",
                   "e.g. levels: [0, 0.5, 1]")
        for name, q in (("input", iq), ("output", oq)):
            if q[0] < 1 or any(b < a for a, b in zip(q, q[1:])):
                S.fail(S.join(field, name), f"empirical {name} quantiles must be ≥ 1 and non-decreasing",
                       "list the tokens at each level, smallest first")
        if not (-1.0 < rho < 1.0):
            S.fail(S.join(field, "rho"), f"rho must lie in (-1, 1), got {rho}", "e.g. rho: 0.3")
        med = lambda q: float(np.interp(0.5, lv, q))  # noqa: E731
        return cls("empirical", Marginal(med(iq), 0.0, int(round(iq[0])), int(round(iq[-1]))),
                   Marginal(med(oq), 0.0, int(round(oq[0])), int(round(oq[-1]))), float(rho), lv, iq, oq)

    def to_dict(self) -> dict:
        if self.kind == "fixed":
            return {"kind": "fixed", "input": int(self.input.median), "output": int(self.output.median)}
        if self.kind == "empirical":
            return {"kind": "empirical", "levels": [round(x, 6) for x in self.levels],
                    "input": [round(x, 3) for x in self.input_q], "output": [round(x, 3) for x in self.output_q],
                    "rho": round(float(self.rho), 6)}
        m = lambda x: {"median": x.median, "sigma": x.sigma, "min": x.min, "max": x.max}  # noqa: E731
        return {"kind": "lognormal", "input": m(self.input), "output": m(self.output), "rho": self.rho}

    @classmethod
    def from_dict(cls, d: dict, field: str = "workload.lengths") -> "LengthDist":
        """Check a lengths mapping with the spec kit (unknown keys, numbers, ranges)."""
        d = S.mapping(d, field, known=("kind", "input", "output", "rho", "levels"),
                      example="{kind: fixed, input: 512, output: 200}")
        kind = S.choice(d.get("kind", "lognormal"), S.join(field, "kind"), ("lognormal", "fixed", "empirical"))
        if kind == "fixed":
            S.unknown_keys(d, ("kind", "input", "output"), field)
            i = S.number(d.get("input", 512), S.join(field, "input"), integer=True, minimum=1)
            o = S.number(d.get("output", 200), S.join(field, "output"), integer=True, minimum=1)
            return cls("fixed", Marginal(i, 0.0, i, i), Marginal(o, 0.0, o, o), 0.0)
        if kind == "empirical":
            S.unknown_keys(d, ("kind", "levels", "input", "output", "rho"), field)
            lists = {}
            for key in ("levels", "input", "output"):
                f = S.join(field, key)
                seq = S.sequence(d.get(key), f, optional=False, nonempty=True, example="[0, 0.5, 1]")
                lists[key] = [S.number(x, S.index(f, i)) for i, x in enumerate(seq)]
            rho = S.number(d.get("rho", 0.0), S.join(field, "rho"), above=-1.0, below=1.0)
            return cls.empirical(lists["levels"], lists["input"], lists["output"], rho, field)
        S.unknown_keys(d, ("kind", "input", "output", "rho"), field)
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
