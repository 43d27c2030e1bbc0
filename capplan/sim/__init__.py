"""Synthetic load sweeps: arrivals, joint lengths, a continuous-batching replica simulator, the
demo study, the one evaluator of simulated attainment at a rate (``steady``, with the one
capacity bisection) and ground-truth attainment. See docs/synth.md."""

from .arrivals import Trace, arrival_times_ns, load_trace, replay_schedule
from .config import PRESETS, SynthConfig, load_config, parse_config, preset
from .engine import ClosedLoop, ReplicaParams, SimResult, simulate
from .evaluate import Steady, bisect_crossing, bracket_crossing, run_study, steady
from .lengths import LengthDist
from .service import DEFAULT_SERVICE_MODEL, ServiceModel, fit_service_model
from .sweep import generate_study, plan_runs, simulate_level
from .truth import CapacityTruth, TruthResult, true_attainment, true_capacity

__all__ = ["Trace", "arrival_times_ns", "load_trace", "replay_schedule", "PRESETS", "SynthConfig",
           "load_config", "parse_config", "preset", "ClosedLoop", "ReplicaParams", "SimResult",
           "simulate", "Steady", "steady", "run_study", "bisect_crossing", "bracket_crossing", "LengthDist",
           "DEFAULT_SERVICE_MODEL", "ServiceModel", "fit_service_model",
           "generate_study", "plan_runs", "simulate_level", "CapacityTruth", "TruthResult",
           "true_attainment", "true_capacity"]
