"""KV-memory bound, work units and power: hand-computed cases (docs/mix.md)."""

from __future__ import annotations

import pytest

from capplan.cli import main
from capplan.errors import SpecError
from capplan.kv import GIB, ModelInfo, GPUInfo, kv_budget, load_catalogue
from capplan.plan import load_plan_spec, make_plan

from conftest import ev


def test_llama31_70b_on_four_h100_by_hand():
    b = kv_budget("llama-3.1-70b", "h100-80gb", 4, context_tokens=8192)
    # 2 × 80 layers × 8 KV heads × 128 × 2 bytes
    assert b.kv_bytes_per_token == 327_680
    assert b.weight_bytes == pytest.approx(70.6e9 * 2)
    # 4 × 80 GiB × 0.9 = 288 GiB = 309 237 645 312 bytes; minus 141.2e9 of weights
    assert b.usable_bytes == 288 * GIB
    assert b.kv_bytes == pytest.approx(309_237_645_312 - 141_200_000_000)
    assert b.kv_tokens == 168_037_645_312 // 327_680 == 512_810
    assert b.tokens_per_sequence == 8192
    assert b.max_sequences == 62  # 512 810 / 8192 = 62.6
    assert b.max_sequences_at(100) == 512_810 // 112  # 7 blocks of 16 tokens


def test_mistral_7b_on_one_l40s_fp8_by_hand():
    b = kv_budget("Mistral-7B", "L40S", 1, context_tokens=4000, kv_dtype="fp8",
                  activation_reserve=0.05)
    assert b.kv_bytes_per_token == 2 * 32 * 8 * 128 * 1 == 65_536
    usable = 48 * GIB * 0.95
    kv = usable - 7.24e9 * 2
    assert b.kv_bytes == pytest.approx(kv)
    assert b.kv_tokens == int(kv // 65_536)
    assert b.max_sequences == b.kv_tokens // 4000  # 4000 is a whole number of 16-token blocks
    rows = {r[0]: r for r in b.items()}
    assert rows["kv_gib_per_replica"][2] == pytest.approx(kv / GIB)
    assert "2 (K and V)" in rows["kv_bytes_per_token"][4]


def test_weights_that_do_not_fit_are_said():
    b = kv_budget(ModelInfo("big", 126, 8, 128, 405.9), GPUInfo("g", 80), 4, context_tokens=100)
    assert not b.weights_fit and b.max_sequences == 0
    assert "do not fit" in b.notes[0]


def test_unknown_model_names_the_catalogue_and_a_near_name():
    with pytest.raises(SpecError) as e:
        kv_budget("llama-3.1-7b", "h100-80gb", 1, context_tokens=10)
    assert "did you mean" in str(e.value) and e.value.field == "model.name"
    with pytest.raises(SpecError, match="unknown KV dtype"):
        kv_budget("llama-3.1-8b", "h100-80gb", 1, context_tokens=10, kv_dtype="int3")


def test_catalogue_entries_are_checked(tmp_path):
    p = tmp_path / "cat.yaml"
    p.write_text("models:\n  m:\n    layers: 0\n    kv_heads: 8\n    head_dim: 128\n    params_b: 1\n")
    with pytest.raises(SpecError) as e:
        load_catalogue(p)
    assert e.value.field == "models.m.layers" and e.value.line == 3
    cat = load_catalogue()
    assert {"llama-3.1-8b", "llama-3.1-70b", "llama-2-70b", "mistral-7b", "mixtral-8x7b",
            "qwen2.5-72b"} <= set(cat.models)
    assert {"h100-80gb", "h200-141gb", "a100-40gb", "a100-80gb", "l40s", "mi300x"} <= set(cat.gpus)
    assert all(m.source for m in cat.models.values()) and all(g.source for g in cat.gpus.values())


def test_kv_command(capsys):
    assert main(["kv", "--model", "llama-3.1-70b", "--gpu", "h100-80gb", "--gpus", "4",
                 "--context", "8192"]) == 0
    out = capsys.readouterr().out
    assert "327,680" in out and "max concurrent sequences at 8,192 tokens" in out and " 62 " in out
    assert main(["kv", "--model", "llama-3.1-70b"]) == 2
    assert "needs --gpu, --gpus, --context" in capsys.readouterr().err
    assert main(["kv", "--list"]) == 0


def _spec(**sections):
    d = {"demand": {"peak_rps": 10.0}, "replica_group": {"gpus_per_replica": 4, "gpus_per_node": 8},
         "failure": {"policy": "none", "zones": 1}, "prices": {"usd_per_gpu_hour": 2.0}}
    d.update(sections)
    return load_plan_spec(d)


def test_plan_kv_check_fires_when_the_forecast_context_is_long():
    model = {"name": "llama-3.1-70b", "gpu": "h100-80gb", "mean_e2e_s": 10.0}
    # C = 5 req/s per replica, W = 10 s → 50 sequences in flight; 8192 tokens hold 62
    short = make_plan(_spec(model=dict(model, context_tokens=8192)), capacity=5.0)
    chk = {c.key: c for c in short.checks}
    assert chk["kv_bound"].ok and chk["weights_fit"].ok
    assert short.value("kv_sequences_needed") == pytest.approx(50.0)
    assert short.value("kv_max_sequences") == 62
    # 32 768 tokens: 512 810 // 32 768 = 15 sequences < 50 → KV-bound, at most 1.5 req/s
    long = make_plan(_spec(model=dict(model, context_tokens=32768)), capacity=5.0)
    chk = {c.key: c for c in long.checks}
    assert not chk["kv_bound"].ok and not long.ok
    assert "KV-bound before compute-bound" in chk["kv_bound"].sentence
    assert long.value("kv_bound_rps_per_group") == pytest.approx(15 / 10.0)


def test_plan_without_a_time_in_system_says_so():
    plan = make_plan(_spec(model={"name": "llama-3.1-8b", "gpu": "l40s", "context_tokens": 4096}),
                     capacity=5.0, gpus_per_group=4)
    assert "kv_bound" not in {c.key for c in plan.checks}
    assert any("KV-bound check not done" in n for n in plan.notes)


def test_power_items_and_rack_cap_by_hand():
    # 10 req/s at 1 req/s per group → 10 groups of 4 GPUs = 5 nodes of 8 GPUs
    spec = _spec(power={"gpu_peak_w": 700, "node_overhead_w": 1400, "rack_cap_kw": 15,
                        "nodes_per_rack": 3, "row_cap_kw": 40})
    plan = make_plan(spec, capacity=1.0)
    assert plan.value("nodes") == 5
    assert plan.value("node_peak_kw") == pytest.approx((8 * 700 + 1400) / 1000)  # 7 kW
    assert plan.value("peak_it_power_kw") == pytest.approx(35.0)
    assert plan.value("peak_it_power_rollout_kw") == pytest.approx(35.0 + 1 * 4 * 0.7)
    assert plan.value("racks") == 2
    chk = {c.key: c for c in plan.checks}
    # 3 nodes × 7 kW = 21 kW > 15 kW: only 2 nodes per rack fit
    assert not chk["rack_power"].ok and "at most 2 node(s) per rack" in chk["rack_power"].sentence
    assert chk["row_power"].ok  # 37.8 kW ≤ 40
    ok = make_plan(spec.with_(rack_cap_kw=21.0), capacity=1.0)
    assert {c.key: c.ok for c in ok.checks}["rack_power"]
    with pytest.raises(SpecError, match="needs nodes_per_rack"):
        _spec(power={"rack_cap_kw": 10})


def test_gpu_peak_power_falls_back_to_the_catalogue():
    plan = make_plan(_spec(model={"gpu": "h200-141gb"}, power={"row_cap_kw": 1}), capacity=1.0)
    assert plan.value("gpu_peak_w") == 700
    assert plan.item("gpu_peak_w").formula.startswith("board power limit of h200-141gb")


def test_tokens_per_day_demand_by_hand():
    d = {"tokens_per_day": {"input": 864e6, "output": 86.4e6}, "mean_to_peak": 0.5,
         "input_tokens_per_request": 1000, "output_tokens_per_request": 200}
    plan = make_plan(_spec(demand=d), capacity=4.0)
    # input: 864e6 / 1000 = 864 000 req/day; output: 86.4e6 / 200 = 432 000 → input binds
    # 864 000 / 86 400 s = 10 req/s mean, / 0.5 = 20 req/s peak
    assert plan.value("peak_rps") == pytest.approx(20.0)
    it = plan.item("peak_rps")
    assert it.inputs["binding"] == "input" and it.inputs["requests_per_day"] == pytest.approx(864_000)
    assert plan.value("traffic_groups") == 5
    assert any("input/output ratio differs" in n for n in plan.notes)
    with pytest.raises(SpecError, match="needs mean_to_peak"):
        _spec(demand={"tokens_per_day": {"input": 1e9}})
    with pytest.raises(SpecError, match="both peak_rps and tokens_per_day"):
        _spec(demand={"peak_rps": 3, "tokens_per_day": {"input": 1e9}, "mean_to_peak": 0.5})
    with pytest.raises(SpecError, match="input tokens per request"):
        make_plan(_spec(demand={"tokens_per_day": {"input": 1e9}, "mean_to_peak": 0.5}), capacity=4.0)


def test_token_goodput_and_energy_per_token_from_a_study(make_study):
    # one level at 2 req/s: 4 requests, 3 good (TTFT ≤ 500 ms); input 1000/2000/3000/4000
    rows = [ev("r1", scheduled_ms=i * 500.0, ttft_ms=t, e2e_ms=2000.0, input_tokens=inp,
               output_tokens=100) for i, (t, inp) in enumerate([(100, 1000), (200, 2000), (300, 3000),
                                                                (900, 4000)])]
    path = make_study(rows, runs=[{"run_id": "r1", "offered_rps": 2.0}],
                      system={"gpu": "h100-80gb", "gpus_per_replica": 4, "tp": 4, "pp": 1, "replicas": 1})
    from capplan import open_study

    st = open_study(path)
    plan = make_plan(_spec(replica_group={"gpus_per_node": 8}, slo="ttft_ms=500,attainment=0.5"),
                     capacity=2.0, study=st)
    # at C = 2 req/s: good fraction 3/4, input tokens per good request (1000+2000+3000)/3 = 2000
    assert plan.value("prefill_tokens_per_s_per_group") == pytest.approx(2.0 * 0.75 * 2000)
    assert plan.value("decode_tokens_per_s_per_group") == pytest.approx(2.0 * 0.75 * 100)
    assert plan.value("prefill_tokens_per_s_fleet") == pytest.approx(
        plan.value("total_groups") * 3000.0)
    # the study's system gpu is in the catalogue: its TDP is the peak power without telemetry
    assert plan.value("gpu_peak_w") == 700


def test_kv_bound_sizes_sequences_at_the_p99_context(make_study):
    """Without model.context_tokens the KV bound uses the p99 (type 7) of input + output tokens
    of the tested mix's ok requests — not the mean — and names it; with no such request there
    is no KV number at all."""
    from capplan.cost import study_facts
    from capplan.plan.bounds import kv_items
    from capplan.study import open_study

    # ok requests of 100, 200, …, 10 000 tokens of context (input + 10 output); a failed request
    # with a huge prompt and one before the warm-up do not count
    rows = [ev("r1", f"q{k}", scheduled_ms=1000 + k, input_tokens=100 * k - 10, output_tokens=10) for k in range(1, 101)]
    rows.append(ev("r1", "err", scheduled_ms=1500, input_tokens=90_000, output_tokens=0, ttft_ms=None, e2e_ms=None,
                   status="error"))
    rows.append(ev("r1", "warm", scheduled_ms=10, input_tokens=90_000, output_tokens=10))
    study = open_study(make_study(rows, runs=[{"run_id": "r1", "offered_rps": 1.0, "warmup_s": 0.5}]))
    facts = study_facts(study, "ttft_ms=2000,attainment=0.99")
    # type 7: h = (100 − 1) × 0.99 = 98.01 → 9 900 + 0.01 × (10 000 − 9 900) = 9 901; the mean is 5 050
    assert facts.context_tokens_q == pytest.approx(9901.0)
    assert facts.mean_input_tokens + facts.mean_output_tokens == pytest.approx(5050.0)
    spec = _spec(model={"name": "llama-3.1-70b", "gpu": "h100-80gb", "mean_e2e_s": 10.0})
    items, checks, notes, budget = kv_items(spec, g=4, capacity_rps=5.0, facts=facts, facts_at_capacity=None,
                                            system={})
    it = {i[0]: i for i in items}
    # 9 901 tokens → 619 blocks of 16 = 9 904 tokens a sequence: 512 810 // 9 904 = 51 (the mean gives 101)
    assert budget.context_tokens == 9901 and it["kv_max_sequences"][2] == 51
    assert it["kv_max_sequences"][5]["context_source"].startswith("p99 of input + output tokens")
    assert any("p99 context (9,901 tokens" in n and "mean 5,050" in n for n in notes)
    # C = 5 req/s × W = 10 s = 50 sequences ≤ 51: holds, just
    assert {c[0]: c[2] for c in checks}["kv_bound"]
    # nothing known: no number
    none = kv_items(spec, g=4, capacity_rps=5.0, facts=None, facts_at_capacity=None, system={})
    assert none[0] == [] and none[3] is None and "no model.context_tokens" in none[2][0]
