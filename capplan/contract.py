"""The study directory contract v1: names, dtypes, units and enums, declared once.

The validator, the synthetic generator, the importers and the docs all read from here, so a
column is renamed in exactly one place. See docs/study-contract.md for the prose version.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import pyarrow as pa

CONTRACT_VERSION = "capplan-study/1"
MANIFEST_NAME = "study.yaml"
EVENTS_DIR = "events"
RESOURCES_DIR = "resources"

NS_PER_S = 1_000_000_000
NS_PER_MS = 1_000_000


class Status(str, Enum):
    """Final state of an offered request. Only ``ok`` can be SLO-good."""

    OK = "ok"
    REJECTED = "rejected"
    TIMEOUT = "timeout"
    ERROR = "error"
    CANCELLED = "cancelled"


STATUSES: tuple[str, ...] = tuple(s.value for s in Status)


class LoadModel(str, Enum):
    OPEN = "open"  # arrival schedule independent of responses (offered_rps)
    CLOSED = "closed"  # fixed concurrency: a new request when one finishes


ARRIVALS: tuple[str, ...] = ("constant", "poisson", "gamma", "replay", "concurrency", "unknown")


@dataclass(frozen=True)
class Column:
    name: str
    dtype: pa.DataType
    required: bool
    nullable: bool
    meaning: str
    unit: str = ""


# One row per *offered* request: rejected, failed and unfinished ones included.
EVENT_COLUMNS: tuple[Column, ...] = (
    Column("run_id", pa.string(), True, False, "a run of study.yaml"),
    Column("request_id", pa.string(), True, False, "unique within its run"),
    Column("scheduled_ns", pa.int64(), True, False,
           "intended arrival, ns since the run's start (one monotonic clock per run)", "ns"),
    Column("sent_ns", pa.int64(), False, True, "actual client send", "ns"),
    Column("first_token_ns", pa.int64(), True, True, "first non-empty token received; null if none", "ns"),
    Column("last_token_ns", pa.int64(), True, True, "last token received; null if none", "ns"),
    Column("input_tokens", pa.int64(), True, False, "logical prompt tokens", "tokens"),
    Column("output_tokens", pa.int64(), True, False, "output tokens received, 0 when none", "tokens"),
    Column("max_output_tokens", pa.int64(), False, True,
           "output tokens the client asked for (max_tokens); the offered output length", "tokens"),
    Column("status", pa.string(), True, False, "one of " + ", ".join(STATUSES)),
    Column("itl_ns", pa.list_(pa.int64()), False, True, "gaps between successive output tokens or chunks", "ns"),
    Column("admitted_ns", pa.int64(), False, True, "server admitted the request to a batch", "ns"),
    Column("prefill_start_ns", pa.int64(), False, True, "server started its prefill", "ns"),
    Column("server_received_ns", pa.int64(), False, True, "server received the request", "ns"),
    Column("computed_input_tokens", pa.int64(), False, True, "prefill tokens actually computed (prefix-cache misses)", "tokens"),
    Column("tenant", pa.string(), False, True, "tenant / customer"),
    Column("slo_class", pa.string(), False, True, "SLO class (e.g. interactive, batch)"),
    Column("finish_reason", pa.string(), False, True, "stop, length, abort, ..."),
    Column("replica_group", pa.string(), False, True, "replica group that served it"),
    Column("prefix_group", pa.string(), False, True,
           "shared prompt prefix the request starts with (e.g. a system prompt's name or hash)"),
    Column("session_id", pa.string(), False, True,
           "conversation the request belongs to (a multi-turn session; later turns repeat earlier ones)"),
    Column("agent_root", pa.string(), False, True,
           "the root request (an agent or RAG request) this model call was made for; every call of "
           "one root carries the same value"),
    Column("branch_depth", pa.int64(), False, True,
           "the call's step in its root's tree: calls of one root at the same depth run in "
           "parallel, depths run one after another (0 first)", "steps"),
)

EVENT_COLUMN_BY_NAME: dict[str, Column] = {c.name: c for c in EVENT_COLUMNS}
REQUIRED_EVENT_COLUMNS: tuple[str, ...] = tuple(c.name for c in EVENT_COLUMNS if c.required)
INT_NS_COLUMNS: tuple[str, ...] = tuple(
    c.name for c in EVENT_COLUMNS if c.name.endswith("_ns") and c.dtype == pa.int64()
)
STRING_OPTIONAL_COLUMNS: tuple[str, ...] = ("tenant", "slo_class", "finish_reason", "replica_group",
                                            "prefix_group", "session_id", "agent_root")

EVENT_SCHEMA = pa.schema([pa.field(c.name, c.dtype, nullable=c.nullable) for c in EVENT_COLUMNS])

# Telemetry samples under resources/ (one row per GPU per sample).
RESOURCE_COLUMNS: tuple[Column, ...] = (
    Column("t_ns", pa.int64(), True, False, "sample time, ns on the study clock (or since epoch)", "ns"),
    Column("gpu_index", pa.int64(), True, False, "GPU index on its host"),
    Column("power_w", pa.float64(), True, True, "instantaneous board power", "W"),
    Column("energy_mj", pa.float64(), False, True, "total energy counter since driver load", "mJ"),
    Column("gpu_util_pct", pa.float64(), False, True, "GPU utilisation", "%"),
    Column("mem_used_bytes", pa.int64(), False, True, "framebuffer memory used", "bytes"),
    Column("sm_clock_mhz", pa.float64(), False, True, "SM clock", "MHz"),
    Column("run_id", pa.string(), False, True, "run the sample belongs to, if known"),
    Column("host", pa.string(), False, True, "host name"),
)
RESOURCE_SCHEMA = pa.schema([pa.field(c.name, c.dtype, nullable=c.nullable) for c in RESOURCE_COLUMNS])

# System events under timeline/ (optional): one row per event on the run's clock. A study with
# a timeline says what happened to the serving system during a run (a replica failed, the
# autoscaler decided, a rollout step began), so `capplan timeline` can measure what it did to
# the SLO. docs/study-contract.md section 9 and docs/timeline.md.
TIMELINE_DIR = "timeline"


class TimelineEvent(str, Enum):
    """What happened to the serving system at ``t_ns``."""

    REPLICA_ADDED = "replica_added"  # a replica was asked for (provisioning starts)
    REPLICA_READY = "replica_ready"  # it serves: the router sends it requests
    REPLICA_DRAINING = "replica_draining"  # it takes no new requests, finishes those it holds
    REPLICA_REMOVED = "replica_removed"  # it left the pool (after a drain, or routes removed)
    REPLICA_FAILED = "replica_failed"  # it stopped serving; requests it held are lost or retried
    SCALE_DECISION = "scale_decision"  # the autoscaler set its desired count
    FAULT_INJECTED = "fault_injected"  # a test harness broke something on purpose
    ROLLOUT_STEP = "rollout_step"  # a rollout step began (replicas swapped for a new version)
    CACHE_FLUSH = "cache_flush"  # a replica's prefix cache was emptied (restart, rollout, flush)
    LOAD_STEP = "load_step"  # the offered request rate stepped (rate_before_rps → rate_rps)


TIMELINE_EVENTS: tuple[str, ...] = tuple(e.value for e in TimelineEvent)
#: events that name one replica (the others may name a group, or nothing)
REPLICA_EVENTS: tuple[str, ...] = ("replica_added", "replica_ready", "replica_draining",
                                   "replica_removed", "replica_failed")

TIMELINE_COLUMNS: tuple[Column, ...] = (
    Column("run_id", pa.string(), True, False, "the run of study.yaml the event happened in"),
    Column("t_ns", pa.int64(), True, False, "event time, ns on the run's clock (as scheduled_ns)", "ns"),
    Column("event", pa.string(), True, False, "one of " + ", ".join(TIMELINE_EVENTS)),
    Column("replica", pa.string(), False, True,
           "replica id (the replica_group value its requests carry); required for replica_* events"),
    Column("group", pa.string(), False, True,
           "failure domain or group the event concerns (zone, node, rollout group)"),
    Column("desired", pa.int64(), False, True, "scale_decision: replicas the autoscaler wants", "replicas"),
    Column("ready", pa.int64(), False, True, "scale_decision: replicas ready when it decided", "replicas"),
    Column("signal", pa.string(), False, True,
           "scale_decision: the signal that set desired (queue_work, ttft_p99, kv_use, goodput)"),
    Column("signal_value", pa.float64(), False, True, "scale_decision: that signal's value"),
    Column("rate_rps", pa.float64(), False, True,
           "scale_decision: the arrival rate it saw over its evaluation period; load_step: the "
           "offered rate after the step", "req/s"),
    Column("rate_before_rps", pa.float64(), False, True,
           "load_step: the offered rate before the step", "req/s"),
    Column("queue_work_s", pa.float64(), False, True,
           "scale_decision: work waiting and left in running requests, seconds of one replica's "
           "service", "s"),
    Column("work_rate_replicas", pa.float64(), False, True,
           "scale_decision: work arriving per second over its window, in replicas' worth "
           "(λ_w / C in one work unit)", "replicas"),
    Column("detail", pa.string(), False, True, "free text (what was injected, which rollout step)"),
)
TIMELINE_COLUMN_BY_NAME: dict[str, Column] = {c.name: c for c in TIMELINE_COLUMNS}
TIMELINE_SCHEMA = pa.schema([pa.field(c.name, c.dtype, nullable=c.nullable) for c in TIMELINE_COLUMNS])

# The serving engine's own Prometheus /metrics (optional, under engine_metrics/): one row per
# counter or gauge sample per scrape, on the run's clock. `capplan telemetry engine` writes it
# from a recorded scrape file; `capplan summarize` reads preemptions, KV-cache usage and queue
# depth from it. docs/study-contract.md section 10 and docs/engine-metrics.md.
ENGINE_METRICS_DIR = "engine_metrics"
ENGINE_METRIC_KINDS: tuple[str, ...] = ("counter", "gauge", "untyped")

ENGINE_METRIC_COLUMNS: tuple[Column, ...] = (
    Column("run_id", pa.string(), True, False, "the run of study.yaml the scrape was taken in"),
    Column("t_ns", pa.int64(), True, False, "scrape time, ns on the run's clock (as scheduled_ns)", "ns"),
    Column("metric", pa.string(), True, False,
           "metric family name as the engine exports it, a counter's _total suffix removed "
           "(vllm:num_preemptions, llamacpp:requests_deferred)"),
    Column("labels", pa.string(), True, False,
           'the sample\'s labels, sorted, as k="v" pairs joined by commas (empty when none)'),
    Column("kind", pa.string(), True, False, "one of " + ", ".join(ENGINE_METRIC_KINDS)),
    Column("value", pa.float64(), True, False, "the sample's value (a counter's running total)"),
    Column("source", pa.string(), False, True, "the name of the scrape file it was read from"),
)
ENGINE_METRIC_SCHEMA = pa.schema([pa.field(c.name, c.dtype, nullable=c.nullable)
                                  for c in ENGINE_METRIC_COLUMNS])

# Manifest keys.
MANIFEST_REQUIRED = ("contract", "name", "system", "load_model", "runs")
SYSTEM_KEYS = ("gpu", "gpus_per_replica", "tp", "pp", "replicas", "engine", "model")
RUN_REQUIRED_OPEN = ("run_id", "offered_rps")
RUN_REQUIRED_CLOSED = ("run_id", "concurrency")
RUN_OPTIONAL = ("arrival", "duration_s", "warmup_s", "repeat", "nominal_rps", "notes", "cache_condition",
                "epoch_start_ns")
#: the optional ``quality:`` block: an eval result of the build the sweep ran (docs/study-contract.md)
QUALITY_REQUIRED = ("eval", "score", "se")
QUALITY_OPTIONAL = ("higher_is_better", "n", "notes")


@dataclass(frozen=True)
class QualityResult:
    """What the served build scores on an eval, measured on the same build (weights, dtype or
    quantisation, engine, decoding settings) as the load sweep: ``score`` with its standard error
    ``se`` (same units). A cheaper build that serves worse answers is not a cheaper equal, so
    plan candidates are compared on quality before cost (``capplan.plan.candidates``)."""

    eval: str
    score: float
    se: float
    higher_is_better: bool = True
    n: int | None = None  # items the eval scored
    notes: str | None = None

    def __str__(self) -> str:
        return f"{self.eval} {self.score:.4g} ± {self.se:.2g} (SE)"


class CacheCondition(str, Enum):
    """The prefix-cache state a run was measured in (a run's ``cache_condition``). Numbers from
    runs in different states are not comparable: a warm cache hides prefill work a cold one
    pays for (docs/scenarios.md, "Measured cache effect")."""

    COLD_MODEL = "cold_model"  # server just started: weights loaded, nothing compiled or cached
    WARM_MODEL_COLD_KV = "warm_model_cold_kv"  # warmed up (graphs, allocator), prefix cache empty
    PRODUCTION_WARM = "production_warm"  # the prefix cache holds what production traffic leaves
    ADVERSARIAL = "adversarial"  # prompts built to miss the cache (unique prefixes)


CACHE_CONDITIONS: tuple[str, ...] = tuple(c.value for c in CacheCondition)

# Plausibility thresholds for the validator.
RATE_MISMATCH_WARN = 0.10  # measured vs nominal offered rate
# A run whose scheduled span is below this many ns while claiming duration_s >= 1 s looks like
# seconds or milliseconds were written instead of nanoseconds.
MIN_PLAUSIBLE_SPAN_FACTOR = 1e-3

PERCENTILES: tuple[float, ...] = (0.50, 0.90, 0.95, 0.99, 0.999)
PERCENTILE_DEFINITION = (
    "empirical quantile, Hyndman & Fan type 7 (linear interpolation between order statistics)"
)


def _pct_digits(p: float) -> str:
    """0.99 → '99', 0.999 → '99.9', 0.5 → '50' (the percent, shortest exact text)."""
    if not (0.0 < float(p) < 1.0):
        raise ValueError(f"a percentile is a probability in (0, 1), got {p!r}")
    return f"{float(p) * 100:.10g}"


def pct_name(p: float) -> str:
    """The percentile's token in column and key names: ``pct_name(0.99) == "p99"``,
    ``pct_name(0.999) == "p99_9"``. An underscore stands for the decimal point so the name is
    a plain identifier everywhere it travels (SQL, Spark, pandas attributes, CSV, parquet and
    JSON); people read ``pct_label``."""
    return "p" + _pct_digits(p).replace(".", "_")


def pct_label(p: float) -> str:
    """The percentile as people write it: ``pct_label(0.999) == "p99.9"`` (headings, titles)."""
    return "p" + _pct_digits(p)


def pct_col(metric: str, p: float, unit: str = "ms") -> str:
    """The column of a percentile of a metric: ``pct_col("ttft", 0.999) == "ttft_p99_9_ms"``;
    ``unit=""`` leaves the unit off (``"ttft_p99"``, the stem of CI columns)."""
    return f"{metric}_{pct_name(p)}" + (f"_{unit}" if unit else "")


def ci_cols(stem: str) -> tuple[str, str]:
    """The two columns of a confidence interval: ``ci_cols("ttft_p99") ==
    ("ttft_p99_ci_low", "ttft_p99_ci_high")``."""
    return f"{stem}_ci_low", f"{stem}_ci_high"

LATENCY_METRICS: tuple[str, ...] = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")


@dataclass(frozen=True)
class RunSpec:
    """One run of the manifest. Exactly one of offered_rps / concurrency is set."""

    run_id: str
    offered_rps: float | None = None
    concurrency: int | None = None
    arrival: str = "unknown"
    duration_s: float | None = None
    warmup_s: float | None = None
    repeat: int = 0
    nominal_rps: float | None = None
    extra: dict = field(default_factory=dict, compare=False, hash=False)
    cache_condition: str | None = None  # one of CACHE_CONDITIONS, None when not labelled
    #: wall-clock time (epoch ns) of the run clock's 0, when the load tool's clock was wall-clock:
    #: what places the engine's /metrics scrapes on the run's clock (docs/engine-metrics.md)
    epoch_start_ns: int | None = None

    @property
    def load_level(self) -> float:
        """The x-axis of a sweep: offered rate (open) or concurrency (closed)."""
        return float(self.offered_rps if self.offered_rps is not None else self.concurrency)


@dataclass(frozen=True)
class Manifest:
    contract: str
    name: str
    system: dict
    workload: dict
    load_model: str
    runs: tuple[RunSpec, ...]
    raw: dict = field(default_factory=dict, compare=False, hash=False)
    quality: QualityResult | None = None

    @property
    def run_ids(self) -> tuple[str, ...]:
        return tuple(r.run_id for r in self.runs)

    def run(self, run_id: str) -> RunSpec:
        for r in self.runs:
            if r.run_id == run_id:
                return r
        raise KeyError(run_id)

    @property
    def gpus_per_replica(self) -> int:
        sys = self.system or {}
        if sys.get("gpus_per_replica"):
            return int(sys["gpus_per_replica"])
        return int(sys.get("tp", 1) or 1) * int(sys.get("pp", 1) or 1)

    @property
    def replicas(self) -> int:
        return int((self.system or {}).get("replicas", 1) or 1)
