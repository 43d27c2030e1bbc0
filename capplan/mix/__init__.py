"""Capacity for the traffic that will actually come (docs/mix.md).

- ``target``: the production mix — shares per cell (input/output length bucket, tenant, SLO
  class) from a production trace (day and peak hour: ``load_target_periods``) or a bucket table.
"""

from .target import PERIODS, Buckets, TargetMix, bucket_labels, load_target, load_target_periods, parse_edges, \
    target_from_table, target_from_trace

__all__ = ["Buckets", "PERIODS", "TargetMix", "bucket_labels", "load_target", "load_target_periods", "parse_edges",
           "target_from_table", "target_from_trace"]
