"""A calibrated twin of the measured system: fit it to a study, prove it, run scenarios on it.

    from capplan.twin import fit_twin, load_twin, load_scenario, run_scenario
    twin = fit_twin("studies/llama70b")          # frozen Twin: to_text(), to_frame(), figure()
    chk = twin.check("studies/llama70b", "ttft_ms=2000,tpot_ms=100,attainment=0.99")
    runs = twin.simulate(rates=[4, 5, 6], duration_s=600, warmup_s=30, repeats=3, seed=1)

docs/twin.md describes the estimators, the check, the scenario format and the limits;
docs/scenarios.md the serving-policy scenarios (prefix cache, prefill/decode pools, admission and
fair scheduling).
"""

from .capacity import SteadyCSLO, config_cslo, steady_cslo
from .check import TwinCheck, check_twin
from .fit import fit_twin
from .holdout import check_holdout
from .model import Twin, TwinWarning
from .params import DecodePoint, Param, Workload
from .protocol import SimRun, simulate_protocol
from . import fleet  # noqa: F401  (registers the failure, rollout, demand and autoscaler parts)
from .scenario import PARTS, Part, Scenario, ScenarioContext, load_scenario, parse_scenario, register_part, run_scenario
from .twinfile import load_system, load_twin, record_check, twin_from_dict, twin_to_dict, twin_to_yaml, write_twin
from . import parts  # noqa: F401,E402  (registers the serving-policy scenario parts)
from .cachesim import cache_sweep
from .fairsim import compare_policies
from .pd import pd_sweep
from .table import ScenarioTable

__all__ = ["SteadyCSLO", "steady_cslo", "TwinCheck", "check_twin", "fit_twin", "check_holdout", "Twin",
           "TwinWarning", "DecodePoint", "Param", "Workload", "SimRun", "simulate_protocol", "PARTS", "Part", "Scenario",
           "ScenarioContext", "load_scenario", "parse_scenario", "register_part", "run_scenario", "load_twin", "load_system",
           "record_check", "twin_from_dict", "twin_to_dict", "twin_to_yaml", "write_twin", "config_cslo",
           "ScenarioTable", "cache_sweep", "compare_policies", "pd_sweep"]
