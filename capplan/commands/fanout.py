"""`capplan fanout STUDY --slo ... [--fanout 4 [--depth 2] [--tool-s 1.5]] [--root-e2e-ms L]
[--capacity-rps C] [--kv-tokens N]`: capacity in root (agent / RAG) requests per second — the
per-call C_SLO at the per-call attainment the root target needs, over the calls per root, against
the KV the tools park; the fan-out measured from the study's agent_root / branch_depth columns or
given (docs/fanout.md)."""

from __future__ import annotations

import click


@click.command("fanout")
@click.argument("study", type=click.Path(), required=False)
@click.option("--slo", "slo_text", required=True,
              help="the per-call SLO, e.g. ttft_ms=2000,tpot_ms=100,attainment=0.99 (its attainment "
                   "is the root target unless --root-attainment)")
@click.option("--root-attainment", type=float, default=None,
              help="the share of root requests that must be good (default: the SLO's attainment)")
@click.option("--root-e2e-ms", type=float, default=None,
              help="the root's end-to-end limit: split over its sequential steps after its tools")
@click.option("--fanout", "fanout_text", default=None,
              help="calls per root, given: 4, or shares 1:0.5,4:0.3,8:0.2 (default: measured from "
                   "agent_root / branch_depth)")
@click.option("--depth", type=int, default=1, show_default=True,
              help="with --fanout: sequential steps per root (the calls split evenly)")
@click.option("--tool-s", type=float, default=0.0, show_default=True,
              help="with --fanout: seconds of tool between two steps")
@click.option("--context-tokens", type=float, default=None,
              help="with --fanout: KV tokens a held call keeps (for the KV held for tools)")
@click.option("--capacity-rps", type=float, default=None,
              help="the per-call capacity (req/s) at the SLO's attainment, instead of fitting the "
                   "envelope (then not re-fitted at the attainment the roots need)")
@click.option("--kv-tokens", type=float, default=None,
              help="KV tokens of the measured system (capplan kv's KV tokens × replicas): bounds "
                   "the roots by the KV their tools park")
@click.option("--use", "which", type=click.Choice(["lower_bound", "estimate"]), default="lower_bound",
              show_default=True, help="which C_SLO of the fitted envelope")
@click.option("--reps", type=int, default=200, show_default=True, help="bootstrap replicates")
@click.option("--seed", type=int, default=0, show_default=True)
def cmd(study, slo_text, root_attainment, root_e2e_ms, fanout_text, depth, tool_s, context_tokens,
        capacity_rps, kv_tokens, which, reps, seed) -> int:
    """Capacity in root (agent / RAG) requests per second from the per-call capacity."""
    from ..errors import SpecError
    from ..fanout import fanout_capacity, given_fanout, parse_fanout

    fan = None
    if fanout_text is not None:
        fan = given_fanout(parse_fanout(fanout_text), depth=depth, tool_s=tool_s,
                           context_tokens=context_tokens)
    if study is None and (fan is None or capacity_rps is None):
        raise SpecError("capplan fanout needs a STUDY, or both --fanout and --capacity-rps",
                        fix="capplan fanout STUDY --slo ttft_ms=2000,attainment=0.99, or "
                            "capplan fanout --slo ... --fanout 4 --capacity-rps 12")
    res = fanout_capacity(study, slo_text, fanout=fan, root_target=root_attainment,
                          root_e2e_ms=root_e2e_ms, capacity_rps=capacity_rps, which=which,
                          kv_tokens=kv_tokens, reps=reps, seed=seed)
    click.echo(res.to_text())
    return 0
