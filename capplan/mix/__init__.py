"""Capacity for the traffic that will actually come (docs/mix.md).

- ``target``: the production mix — shares per cell (input/output length bucket, tenant, SLO
  class) from a production trace (day and peak hour) or a bucket table.
"""

from .target import Buckets, TargetMix, bucket_labels, load_target, parse_edges, target_from_table, \
    target_from_trace, target_from_trace_periods

__all__ = ["Buckets", "TargetMix", "bucket_labels", "load_target", "parse_edges", "target_from_table",
           "target_from_trace", "target_from_trace_periods"]
