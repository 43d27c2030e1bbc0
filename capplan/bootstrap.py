"""Block bootstrap on per-unit sufficient statistics: one resampling path for every consumer.

A *unit* is a run's sub-block of consecutive requests (``capplan.reduce``: by request count or
by scheduled-time width); a replicate is a draw of blocks of consecutive units. Every additive
statistic of every replicate is a sum over the drawn units, computed as block sums from prefix
sums (``Resample.sums``) — good counts, request counts, per-cell counts, histogram bins — and
ratios (attainment) and quantiles (read from replicate histograms) follow from those sums. This
replaces calling a Python statistic once per replicate (the reference ``arch.bootstrap``
design), which is 10²–10³× slower at our sizes (docs/statistics.md#block-bootstrap).

Schemes are objects, one class each, as in ``arch`` (``StationaryBootstrap`` overrides one
method of ``CircularBlockBootstrap``): ``Circular``, ``Stationary`` (overrides ``_draw``) and
``IID`` (block length 1). A name becomes an object once, at the edge (CLI option,
``fit_envelope(scheme=...)``): ``scheme_from_name("circular", block_len=None)``. Each scheme
knows its block length (the override in requests, else the run's Politis–White length for
that scheme) and draws its replicates; the draws are arch's, so that with one request per unit
and the same seed the replicates are identical (the oracle tests rely on it).

Getting the replicates of one run (what the envelope and compare do)::

    from capplan import bootstrap as boot
    from capplan.reduce import reduce_study, TimeUnits, Cells
    stats = reduce_study(study, slo, warmup=window)          # or units=TimeUnits(...), cells=...
    scheme = boot.scheme_from_name("circular")               # once, at the edge
    run = stats.runs[i]
    R = stats.resample(run, scheme, reps=1000, seed=0)       # cached; stream [seed, run_idx]
    # (or, without the cache: scheme.resample(run.n_units,
    #      scheme.block_units(run.block_len, run.unit_size), reps, rng))
    good = R.sums(run.units["n_good"])                       # (reps,)
    att = good / R.sums(run.units["n"])                      # replicate attainment
    per_cell = R.sums(run.cells.sums["n_good"])              # (reps × cells) with Cells
    p99 = boot.quantile_replicates(R, hist, k0, 0.99, below=below)

Paired designs (two studies replaying the same trace on the same time grid, so their runs
have the same units) use the *same* ``Resample`` on both sides: ``R.sums(a) - R.sums(b)``.
``R.counts()`` gives the equivalent (reps × units) count matrix where a matrix product is
handier (the SLO surface).

Lattice sub-blocks: when a unit holds s requests and L = b/s units form a block, block starts
fall on a lattice of step s; with s ≈ b/4 or finer this stays close to the request-level
circular bootstrap (docs/statistics.md#block-bootstrap) while the arrays stay small.

Block length: Politis & White (2004) with the Patton, Politis & White (2009) correction, as
computed by ``arch.bootstrap.optimal_block_length`` (same tuning constants, same finite-sample
conventions), with the autocovariances by FFT so that it is O(n log n) instead of O(n^1.5)
(docs/statistics.md#block-length). Which series it is computed on is ``capplan.reduce``'s rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from . import sketch
from .errors import SpecError

def as_rng(seed) -> np.random.Generator:
    """A numpy Generator from an int seed (``default_rng``, as arch does) or a Generator."""
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.default_rng(None if seed is None else int(seed))


# ----------------------------------------------------------------------------- block length

@dataclass(frozen=True)
class BlockLength:
    """Politis–White optimal block lengths (in observations) for the two schemes."""

    stationary: float
    circular: float


def autocovariances(x, max_lag: int) -> np.ndarray:
    """γ̂_k = n⁻¹ Σ_{t>k} (x_t − x̄)(x_{t−k} − x̄) for k = 0..max_lag, by FFT.

    Short series: one zero-padded transform of the whole series. Long ones (Politis–White
    needs lags up to √n + k_n only): overlap-save blocks — each block of B values is
    correlated with itself and the next ``max_lag`` values by transforms of size
    B + max_lag, and the products are summed before one inverse transform. Same sums, in
    cache-sized transforms: on 10⁶ values 2× less CPU than one transform of 10⁶."""
    from scipy import fft as _fft

    x = np.asarray(x, dtype=np.float64)
    n = x.size
    e = x - x.mean()
    nfft = max(_ACOV_BLOCK, 1 << int(math.ceil(math.log2(4 * (max_lag + 1)))))
    if n < 2 * nfft:
        # zero-padding to n + max_lag is enough to keep lags ≤ max_lag free of wrap-around
        nf = _fft.next_fast_len(n + max_lag + 1, real=True)
        f = _fft.rfft(e, nf)
        return _fft.irfft(f.real**2 + f.imag**2, nf)[: max_lag + 1] / n
    step = nfft - max_lag  # values per block; each block also sees the next max_lag values
    nb = -(-n // step)
    pad = np.zeros(nb * step + max_lag)
    pad[:n] = e
    head = np.zeros((nb, nfft))
    head[:, :step] = pad[: nb * step].reshape(nb, step)
    ahead = np.lib.stride_tricks.as_strided(pad, shape=(nb, step + max_lag),
                                            strides=(step * pad.itemsize, pad.itemsize))
    prod = np.einsum("ij,ij->j", _fft.rfft(head, axis=1).conj(),
                     _fft.rfft(ahead, n=nfft, axis=1))
    return _fft.irfft(prod, nfft)[: max_lag + 1] / n


#: transform size of the blocked autocovariances (fits a core's cache)
_ACOV_BLOCK = 1 << 15


def optimal_block_length(x) -> BlockLength:
    """Politis–White (2004) / Patton–Politis–White (2009) block length of a 1-D series.

    Reproduces ``arch.bootstrap.optimal_block_length`` (arch 7/8): m is the first lag after
    which k_n = max(5, ⌊log10 n⌋) consecutive |autocorrelations| are all below
    2·sqrt(log10 n / n); M = min(2·max(m, 1), ⌈√n⌉ + k_n); flat-top window
    λ(s) = min(1, 2(1−|s|)); b = (2G²/D)^(1/3) n^(1/3) capped at ⌈min(3√n, n/3)⌉, with
    D = 2σ̂⁴ (stationary) or 4/3 σ̂⁴ (circular). A constant series returns 1.
    """
    x = np.asarray(x, dtype=np.float64).ravel()
    n = x.size
    if n < 3:
        return BlockLength(1.0, 1.0)
    eps = x - x.mean()
    b_max = math.ceil(min(3 * math.sqrt(n), n / 3))
    kn = max(5, int(np.log10(n)))
    m_max = int(math.ceil(math.sqrt(n))) + kn
    cv = 2 * math.sqrt(math.log10(n) / n)
    lags = min(m_max, n - 1)
    cross = autocovariances(x, lags) * n  # Σ e_t e_{t−i}
    sq = eps * eps
    csum = np.concatenate([[0.0], np.cumsum(sq)])
    total = csum[-1]
    if total <= 0:
        return BlockLength(1.0, 1.0)
    i = np.arange(lags + 1)
    # arch's normalisation: v1 = Σ_{t>i} e_t², v2 = Σ_{t<n−i−1} e_t² (note the off-by-one)
    v1 = total - csum[np.minimum(i + 1, n)]
    v2 = csum[np.maximum(n - i - 1, 0)]
    with np.errstate(divide="ignore", invalid="ignore"):
        abs_acorr = np.abs(cross) / np.sqrt(v1 * v2)
    abs_acorr = np.where(np.isfinite(abs_acorr), abs_acorr, np.inf)
    acv = np.zeros(m_max + 1)
    acv[: lags + 1] = cross / n
    below = abs_acorr < cv
    opt_m = None
    if lags + 1 > kn:
        # window of kn consecutive lags [i−kn, i) all below the band, for i = kn..lags
        run = np.convolve(below.astype(np.int64), np.ones(kn, dtype=np.int64), "valid")
        # run[j] covers lags j..j+kn−1, i.e. i = j + kn
        hits = np.nonzero(run[: lags + 1 - kn] == kn)[0]
        if hits.size:
            opt_m = int(hits[0])
    m = 2 * max(opt_m, 1) if opt_m is not None else m_max
    m = min(m, m_max)
    k = np.arange(1, m + 1)
    lam = np.where(k / m <= 0.5, 1.0, 2.0 * (1.0 - k / m))
    g = float(np.sum(2 * lam * k * acv[1: m + 1]))
    lr_acv = float(acv[0] + np.sum(2 * lam * acv[1: m + 1]))
    if not (lr_acv > 0) or g == 0.0:
        return BlockLength(1.0, 1.0)
    b_sb = ((2 * g**2) / (2 * lr_acv**2)) ** (1 / 3) * n ** (1 / 3)
    b_cb = ((2 * g**2) / (4 / 3 * lr_acv**2)) ** (1 / 3) * n ** (1 / 3)
    return BlockLength(float(min(b_sb, b_max)), float(min(b_cb, b_max)))


# ----------------------------------------------------------------------------- replicates

@dataclass(frozen=True)
class Resample:
    """A set of block-bootstrap replicates kept as blocks (start, length[, replicate]) rather
    than as a count matrix: sums over a replicate are then block sums from prefix sums,
    gathered and added — exact, O(blocks × stats), and free of BLAS threading (which on a
    shared, oversubscribed machine can make a small matrix product 100× slower).
    ``counts()`` gives the equivalent (reps × units) count matrix.

    Two layouts: *regular* (circular schemes: every replicate has the same blocks per
    position, ``rep`` is None and ``length`` holds the nb per-position lengths, all equal but
    the last), gathered without a loop over blocks; and general (stationary: ``rep`` and
    ``length`` give every block's replicate and length)."""

    n_units: int
    reps: int
    start: np.ndarray         # (blocks,) first unit of each block, replicate after replicate
    length: np.ndarray        # (blocks,) units per block; regular: (blocks per replicate,)
    rep: np.ndarray | None = None  # (blocks,) replicate of each block, non-decreasing

    @property
    def regular(self) -> bool:
        return self.rep is None

    def counts(self, dtype=np.float64) -> np.ndarray:
        """(reps × n_units) draw counts (float64 by default: float32 is exact only < 2^24)."""
        n = self.n_units
        if self.regular:  # replicate position q lies in block b(q), at offset q − start of b
            nb = self.length.size
            st = self.start.reshape(self.reps, nb)
            if nb == n:  # blocks of one unit: each start is the unit drawn
                idx = st
            else:
                first = np.cumsum(self.length) - self.length
                block_of = np.repeat(np.arange(nb), self.length)
                offset = np.arange(block_of.size) - first[block_of]
                idx = st[:, block_of] + offset
                idx[idx >= n] -= n  # start < n and offset < length ≤ n: one wrap at most
            # replicate by replicate: one row's counts stay in the cache, where one bincount
            # over reps × units bins does not (1000 × 1024: 4 against 12–14 ms)
            out = np.empty((self.reps, n), dtype=dtype)
            for r in range(self.reps):
                out[r] = np.bincount(idx[r], minlength=n)
            return out
        out = np.zeros(self.reps * n, dtype=np.int64)
        full, part = np.divmod(self.length, n)
        if full.any():  # blocks longer than the series (possible in the stationary scheme)
            np.add.at(out.reshape(self.reps, n), self.rep[full > 0],
                      full[full > 0][:, None] * np.ones(n, dtype=np.int64))
        mx = int(part.max()) if part.size else 0
        if mx:
            off = np.arange(mx, dtype=np.int64)
            mask = off[None, :] < part[:, None]
            idx = (self.start[:, None] + off[None, :]) % n + (self.rep * n)[:, None]
            out += np.bincount(idx[mask], minlength=self.reps * n)
        return out.reshape(self.reps, n).astype(dtype)

    def sums(self, values, chunk: int = 1 << 22) -> np.ndarray:
        """Σ over each replicate of per-unit ``values`` ((units,) → (reps,), or
        (units × k) → (reps × k)), as block sums from circular prefix sums."""
        v = np.asarray(values, dtype=np.float64)
        vec = v.ndim == 1
        v2 = v[:, None] if vec else v
        n, k = v2.shape
        pref = np.zeros((2 * n + 1, k))
        np.cumsum(np.concatenate([v2, v2]), axis=0, out=pref[1:])
        total = pref[n]
        if self.regular:  # nb blocks of L units per replicate, the last one cut short
            nb = self.length.size
            st = self.start.reshape(self.reps, nb)
            L, last = int(self.length[0]), int(self.length[nb - 1])
            j = np.arange(n)
            bs_l = pref[j + L] - pref[j]
            bs_last = pref[j + last] - pref[j]
            out = np.empty((self.reps, k))
            step = max(1, chunk // max(nb * k, 1))
            for a in range(0, self.reps, step):
                s_ = st[a: a + step]
                out[a: a + step] = bs_l[s_[:, :-1]].sum(axis=1) + bs_last[s_[:, -1]]
            return out[:, 0] if vec else out
        full, part = np.divmod(self.length, n)
        out = np.zeros((self.reps, k))
        step = max(1, chunk // max(k, 1))
        for a in range(0, self.rep.size, step):
            sl = slice(a, a + step)
            st = self.start[sl]
            bs = pref[st + part[sl]] - pref[st]
            if full[sl].any():
                bs += full[sl][:, None] * total[None, :]
            rp = self.rep[sl]
            first = np.flatnonzero(np.r_[True, rp[1:] != rp[:-1]])  # rep is non-decreasing
            out[rp[first]] += np.add.reduceat(bs, first, axis=0)
        return out[:, 0] if vec else out


# ----------------------------------------------------------------------------- schemes

@dataclass(frozen=True)
class Circular:
    """Circular block bootstrap (Politis & Romano 1992): ⌈n/L⌉ block starts drawn uniformly,
    each block covering L consecutive units (wrapping round the end), the last one cut so a
    replicate holds exactly n units. The draws are those of
    ``arch.bootstrap.CircularBlockBootstrap``: with one request per unit and the same
    generator, the replicates are identical.

    ``block_len``: block length in requests; None ⇒ each run's Politis–White length for this
    scheme (``BlockLength``)."""

    block_len: float | None = None
    name: ClassVar[str] = "circular"
    #: which Politis–White length the scheme uses (they differ by the constant D)
    pw_field: ClassVar[str] = "circular"
    #: requests independent (iid): consumers may resample requests instead of units
    independent: ClassVar[bool] = False

    def __str__(self) -> str:
        return self.name

    def pw_length(self, pw: BlockLength | None) -> float:
        """The Politis–White length (requests) this scheme reads from a run's lengths."""
        return 1.0 if pw is None else float(getattr(pw, self.pw_field))

    def block_requests(self, pw: BlockLength | None) -> float:
        """The block length in requests: the override, else the run's Politis–White one."""
        return float(self.block_len) if self.block_len is not None else self.pw_length(pw)

    def block_units(self, pw: BlockLength | None, unit_size: float) -> float:
        """Block length in units (≥ 1) of a run whose units hold ``unit_size`` requests on
        average (lattice sub-blocks: docs/statistics.md#block-bootstrap)."""
        return max(1.0, self.block_requests(pw) / max(float(unit_size), 1e-12))

    def resample(self, n_units: int, block_units: float, reps: int, rng) -> Resample:
        """``reps`` replicates over ``n_units`` units with (mean) block length
        ``block_units``."""
        return self._draw(int(n_units), float(block_units), int(reps), as_rng(rng))

    def _draw(self, n: int, L: float, reps: int, rng: np.random.Generator) -> Resample:
        L_ = min(max(1, int(round(L))), n)
        nb = -(-n // L_)
        starts = rng.integers(n, size=(reps, nb), dtype=np.int64)
        length = np.full(nb, L_, dtype=np.int64)
        length[-1] = n - (nb - 1) * L_
        return Resample(n, reps, starts.ravel(), length)


@dataclass(frozen=True)
class Stationary(Circular):
    """Stationary bootstrap (Politis & Romano 1994): geometric block lengths with mean L.
    Per replicate arch's ``StationaryBootstrap`` draws n start indices, then n uniforms; a
    block starts where the uniform is ≤ 1/L (and at position 0). Same draws as arch."""

    name: ClassVar[str] = "stationary"
    pw_field: ClassVar[str] = "stationary"

    def _draw(self, n: int, L: float, reps: int, rng: np.random.Generator) -> Resample:
        p = 1.0 / max(float(L), 1.0)
        reps_l, starts_l, len_l = [], [], []
        pos = np.arange(n)
        for r in range(reps):
            start_draw = rng.integers(n, size=n, dtype=np.int64)
            new = rng.random(n) <= p
            new[0] = True
            at = pos[new]
            starts_l.append(start_draw[at])
            len_l.append(np.diff(np.append(at, n)))
            reps_l.append(np.full(at.size, r, dtype=np.int64))
        return Resample(n, reps, np.concatenate(starts_l), np.concatenate(len_l).astype(np.int64),
                        np.concatenate(reps_l))


@dataclass(frozen=True)
class IID(Circular):
    """Independent draws (block length 1): what ignoring time dependence gives; used to show
    that it under-covers. Consumers that hold request-level counts may draw binomials
    instead (``independent``)."""

    name: ClassVar[str] = "iid"
    independent: ClassVar[bool] = True

    def block_requests(self, pw: BlockLength | None) -> float:
        return 1.0


Scheme = Circular  # the base class every scheme derives from
SCHEMES: dict[str, type[Circular]] = {c.name: c for c in (Circular, Stationary, IID)}


def scheme_from_name(name: str | Circular, block_len: float | None = None) -> Circular:
    """The scheme object for a name ("circular", "stationary", "iid"); call it once, at the
    edge (CLI, ``fit_envelope``). A scheme object passes through (``block_len`` then must be
    None or equal to its own)."""
    if isinstance(name, Circular):
        if block_len is not None and block_len != name.block_len:
            return replace(name, block_len=float(block_len))
        return name
    cls = SCHEMES.get(str(name).strip().lower()) if isinstance(name, str) else None
    if cls is None:
        raise SpecError(f"unknown bootstrap scheme {name!r}", field="scheme",
                        fix="use one of " + ", ".join(SCHEMES))
    if block_len is not None:
        if not (isinstance(block_len, (int, float)) and math.isfinite(block_len)
                and block_len >= 1):
            raise SpecError(f"block length must be a number ≥ 1 (requests), got {block_len!r}",
                            field="block_len", fix="e.g. --block-len 50, or leave it out for "
                            "Politis–White per run")
        return cls(block_len=float(block_len))
    return cls()


# ----------------------------------------------------------------------------- statistics

def ratio_replicates(counts: np.ndarray, num, den) -> np.ndarray:
    """Replicates of Σnum/Σden (e.g. attainment = good / requests) for each count row.

    Shapes: ``num`` and ``den`` are each (units,) or (units × k). Both 1-D → (reps,);
    2-D ``num`` with 1-D ``den`` → (reps × k), k ratios sharing a denominator; 1-D ``num``
    with 2-D ``den`` → (reps × k), one numerator over k denominators; both 2-D → (reps × k),
    column by column (k must match)."""
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    if num.ndim > 2 or den.ndim > 2:
        raise ValueError("ratio_replicates: num and den must be (units,) or (units × k)")
    if num.ndim == 2 and den.ndim == 2 and num.shape[1] != den.shape[1]:
        raise ValueError(f"ratio_replicates: num has {num.shape[1]} columns, den "
                         f"{den.shape[1]}; they must match")
    top = _sum(counts, num)
    bot = _sum(counts, den)
    if top.ndim == 2 and bot.ndim == 1:
        bot = bot[:, None]
    elif top.ndim == 1 and bot.ndim == 2:
        top = top[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        return top / bot


def quantile_replicates(counts: np.ndarray, hist, k0: int, p, alpha: float = sketch.DEFAULT_ALPHA,
                        below=None) -> np.ndarray:
    """Replicates of quantile(s) p from per-unit log-bucket histograms ``hist`` (units × bins,
    keys k0, k0+1, …) and optional per-unit counts under bucket k0 (``below``)."""
    hist = np.asarray(hist, dtype=np.float64)
    if below is None:
        return sketch.quantile_from_counts(count_sums(counts, hist), k0, p, alpha)
    s = count_sums(counts, np.column_stack([hist, np.asarray(below, dtype=np.float64)]))
    return sketch.quantile_from_counts(s[:, :-1], k0, p, alpha, below=s[:, -1])


def count_sums(counts, values: np.ndarray) -> np.ndarray:
    """Replicate sums of per-unit request counts ``values`` ((units,) or units × k), as
    float64. With a float32 count matrix whose sums stay below 2^24 (each replicate draws
    n_units units, so no sum exceeds n_units × the largest row sum of ``values``), the product
    runs in float32: every partial sum is an integer below 2^24, hence exact, and the same
    numbers come out at half the bytes and no float64 copy of the matrix (issue 29's
    benchmark)."""
    if (isinstance(counts, np.ndarray) and counts.dtype == np.float32 and values.size
            and values.min() >= 0 and np.array_equal(values, np.floor(values))
            and counts.shape[1] * float(values.reshape(values.shape[0], -1).sum(axis=1).max())
            < 2**24):
        return (counts @ values.astype(np.float32)).astype(np.float64)
    return _sum(counts, values)


def _sum(counts, values):
    """Replicate sums from a Resample (block sums) or a count matrix (matrix product)."""
    if isinstance(counts, Resample):
        return counts.sums(values)
    return counts @ values


def percentile_ci(values, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided percentile interval (np.percentile, linear — as arch's 'percentile')."""
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return (math.nan, math.nan)
    a = (1.0 - confidence) / 2.0
    lo, hi = np.percentile(v, [100 * a, 100 * (1 - a)])
    return float(lo), float(hi)


def bias_corrected_ci(values, estimate: float, confidence: float = 0.95) -> tuple[float, float]:
    """Efron's bias-corrected (BC) percentile interval: the percentiles shifted by
    z0 = Φ⁻¹(share of replicates below the estimate, ties counted half), i.e. the quantiles
    Φ(2·z0 ± z_{1−α/2}) of the replicates. Where the replicates sit mostly on one side of the
    estimate (a statistic that is median-biased under resampling, as a crossing read off a
    monotone fit is), the plain percentile interval is short on the other side."""
    from scipy import special as _sp
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    if v.size == 0 or not estimate == estimate:
        return (math.nan, math.nan)
    p0 = float(np.mean(v < estimate) + 0.5 * np.mean(v == estimate))
    p0 = min(max(p0, 0.5 / v.size), 1.0 - 0.5 / v.size)
    z0 = float(_sp.ndtri(p0))
    za = float(_sp.ndtri(1.0 - (1.0 - confidence) / 2.0))
    lo, hi = np.percentile(v, [100 * _sp.ndtr(2 * z0 - za), 100 * _sp.ndtr(2 * z0 + za)])
    return float(lo), float(hi)


def lower_bound(values, confidence: float = 0.95) -> float:
    """One-sided percentile lower bound: the (1−confidence) quantile of the replicates."""
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return math.nan
    return float(np.percentile(v, 100 * (1.0 - confidence)))


def clopper_pearson(k: float, n: float, confidence: float = 0.95) -> tuple[float, float]:
    """Exact binomial (Clopper & Pearson 1934) two-sided interval for k successes in n.
    Fractional k, n (effective sample sizes) are allowed through the beta quantiles."""
    from scipy import special as _sp
    if n <= 0:
        return (0.0, 1.0)
    a = 1.0 - confidence
    k = min(max(k, 0.0), n)
    lo = 0.0 if k <= 0 else float(_sp.betaincinv(k, n - k + 1, a / 2))
    hi = 1.0 if k >= n else float(_sp.betaincinv(k + 1, n - k, 1 - a / 2))
    return lo, hi


def design_effect(boot_var: float, p: float, n: float) -> float:
    """Bootstrap variance over the iid binomial variance p(1−p)/n (Kish 1965). NaN when the
    binomial variance is zero (a run with no failures or no successes)."""
    iid = p * (1.0 - p) / n if n > 0 else 0.0
    if not iid > 0:
        return math.nan
    return float(boot_var / iid)


def n_effective(n: float, deff: float) -> float:
    """N_eff = N / design effect; a design effect below 1 (or unknown) is not allowed to
    inflate the sample, so N_eff ≤ N."""
    if not (deff > 1.0):
        return float(n)
    return float(n / deff)
