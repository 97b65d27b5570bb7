"""Quality drift against the original: perplexity, KL divergence, top-1 agreement, gates."""

from compress.eval.drift import Drift, measure_drift
from compress.eval.gates import Gate, check_gates, parse_gates

__all__ = ["Drift", "Gate", "check_gates", "measure_drift", "parse_gates"]
