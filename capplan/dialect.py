"""The few SQL spellings that differ between the two engines of the reduction, DuckDB and
Spark SQL, in one place.

Every per-request expression of capplan (the metrics of ``capplan.metrics``, the status code,
the SLO-good predicate, log-bucket keys, grid codes, cell codes, unit indices of
``capplan.reduce``) is written once, as SQL built by functions that take a ``Dialect``; the
dialect only supplies the names that differ. Everything else is the plain SQL both engines
read alike (CASE, comparisons, ``ln``, ``ceil``, ``floor``, ``greatest``, ``least``,
``coalesce``, CAST to SMALLINT/INTEGER/BIGINT/FLOAT/DOUBLE) with ``?`` parameters bound by
position (DuckDB's ``execute(sql, params)``, Spark's ``spark.sql(sql, args=[...])``).

Two rules keep the numbers identical across engines (docs/scale.md, "Same numbers"):
- integer division is spelled ``floor(a / b)`` over doubles (DuckDB's ``//`` and Spark's
  ``div`` differ for negative numbers), exact for the integers we divide (< 2^53);
- a log-bucket key or grid code is ``ceil(x − ε)`` (``capplan.sketch.KEY_EPS``): the two
  engines' ``ln`` may differ in the last bit, and only a value within ε of an edge could then
  land on different sides.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Dialect:
    """An SQL engine's spelling of list functions and the like."""

    name: str

    @property
    def spark(self) -> bool:
        return self.name == "spark"

    def floor_div(self, a: str, b: str) -> str:
        """⌊a / b⌋ as BIGINT (floor, also for negative a), the same in both engines."""
        return f"CAST(floor(CAST({a} AS DOUBLE) / ({b})) AS BIGINT)"

    def list_len(self, x: str) -> str:
        return f"size({x})" if self.spark else f"len({x})"

    def list_max(self, x: str) -> str:
        return f"array_max({x})" if self.spark else f"list_max({x})"

    def list_quantile(self, x: str, p: float) -> str:
        """Type-7 quantile (linear interpolation) of a non-empty numeric list; ``p`` is a
        constant of the code (not user input)."""
        if not self.spark:
            return f"list_aggregate({x}, 'quantile_cont', {p!r})"
        # h = (n − 1)·p; value = a[⌊h⌋] + (h − ⌊h⌋)·(a[⌊h⌋ + 1] − a[⌊h⌋]) over the sorted list
        s = f"array_sort({x})"
        h = f"((size({x}) - 1) * CAST({p!r} AS DOUBLE))"
        lo = f"CAST(floor({h}) AS INT)"
        hi = f"least({lo} + 1, size({x}) - 1)"
        return (f"(CAST(element_at({s}, {lo} + 1) AS DOUBLE) + ({h} - floor({h})) * "
                f"(CAST(element_at({s}, {hi} + 1) AS DOUBLE) - CAST(element_at({s}, {lo} + 1) "
                "AS DOUBLE)))")

    def list_position(self, values: str, x: str) -> str:
        """1-based position of ``x`` in the list ``values`` (0 when absent)."""
        return f"array_position({values}, {x})" if self.spark else \
            f"coalesce(list_position({values}, {x}), 0)"

    def quantiles(self, col: str) -> str:
        """Exact type-7 quantiles of ``col`` at the probabilities of one bound list
        parameter (Spark's ``percentile`` holds a group's distinct values in memory)."""
        return f"percentile({col}, ?)" if self.spark else f"quantile_cont({col}, ?::DOUBLE[])"

    def list_contains(self, values: str, x: str) -> str:
        return f"array_contains({values}, {x})" if self.spark else \
            f"list_contains({values}, {x})"

    def explode(self, x: str) -> str:
        return f"explode({x})" if self.spark else f"unnest({x})"

    def ident(self, name: str) -> str:
        """A quoted identifier (names come from the contract, never from input)."""
        return f"`{name}`" if self.spark else f'"{name}"'

    def type_name(self, dtype: str) -> str:
        """The SQL type of a contract dtype (``str(pyarrow type)``)."""
        types = ({"string": "STRING", "int64": "BIGINT", "list<item: int64>": "ARRAY<BIGINT>",
                  "double": "DOUBLE"}
                 if self.spark else
                 {"string": "VARCHAR", "int64": "BIGINT", "list<item: int64>": "BIGINT[]",
                  "double": "DOUBLE"})
        return types.get(dtype, types["string"])


DUCKDB = Dialect("duckdb")
SPARK = Dialect("spark")
#: the reduction engines, by name (``--engine``; ``reduce_study(engine=)``)
ENGINES = (DUCKDB.name, SPARK.name)
