"""Quality gates for CI: thresholds per metric, absolute or relative to the original.

Inline: `--gate 'kl<=0.05,top1>=0.9'`. From a file, `--gate-file gates.yaml`:

    kl: {max: 0.05}
    top1: {min: 0.95}
    ppl: {max_increase: 5%}      # relative to the original's perplexity
    size_mb: {max_increase: -60%}  # at least 60% smaller than the original

Relative rules compare with the original's value of the same metric: `max_increase: 5%`
allows value <= original × 1.05; `max_decrease: 10%` allows value >= original × 0.90.
Every gate becomes one absolute test, so the verdict line and the JSON say exactly which
number was compared with which limit.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from pathlib import Path

from compress.errors import LlmpressError
from compress.strict_yaml import load_yaml

METRICS = ("ppl", "base_ppl", "ppl_ratio", "kl", "top1", "size_mb", "bits_per_weight")
# The original's value of each metric: what relative rules are measured from.
ORIGINAL = {"ppl": "base_ppl", "size_mb": "base_size_mb", "bits_per_weight": "base_bits_per_weight"}
RULES = ("max", "min", "max_increase", "max_decrease")
_OPS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}
_GATE = re.compile(r"^\s*([a-z_0-9]+)\s*(<=|>=|<|>)\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?\d+)?)\s*$")


@dataclass(frozen=True)
class Gate:
    metric: str
    op: str
    threshold: float
    rule: str = ""  # how the threshold was derived, e.g. "original 29.98 +5%"

    def check(self, value: float) -> bool:
        return _OPS[self.op](value, self.threshold)

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.threshold:g}"


def parse_gates(expr: str) -> list[Gate]:
    """The tests in `--gate EXPR`; an empty EXPR is refused, since it would silently gate
    nothing (a CI variable that expanded to nothing)."""
    if not expr.strip():
        raise LlmpressError(
            f"--gate {expr!r} is empty, so nothing would be gated: give tests like "
            "'kl<=0.05,top1>=0.9', or leave --gate out"
        )
    gates = []
    for part in expr.split(","):
        m = _GATE.match(part)
        if not m:
            raise LlmpressError(
                f"bad gate {part.strip()!r}: write METRIC OP NUMBER, e.g. 'kl<=0.05,top1>=0.9' "
                f"(metrics: {', '.join(METRICS)}; ops: <=, <, >=, >)"
            )
        metric, op, value = m.groups()
        _check_metric(metric)
        gates.append(Gate(metric, op, float(value)))
    return gates


def _check_metric(metric: str) -> None:
    if metric not in METRICS:
        raise LlmpressError(f"unknown gate metric {metric!r}; use one of {', '.join(METRICS)}")


def _amount(value, where: str) -> float:
    """0.05, 5% or "5%" → 0.05."""
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            return float(value.strip()[:-1]) / 100
        except ValueError:
            pass
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise LlmpressError(f"{where}: {value!r} is not a number or a percentage like 5%")


@dataclass(frozen=True)
class FileGate:
    """A gate as written in the file; `resolve` turns it into an absolute Gate."""

    metric: str
    rule: str
    amount: float

    def resolve(self, metrics: dict[str, float]) -> Gate:
        if self.rule in ("max", "min"):
            return Gate(self.metric, "<=" if self.rule == "max" else ">=", self.amount)
        base = metrics[ORIGINAL[self.metric]]
        sign = 1 if self.rule == "max_increase" else -1
        limit = base * (1 + sign * self.amount)
        text = f"original {base:.5g} {sign * self.amount:+.1%}"
        return Gate(self.metric, "<=" if sign > 0 else ">=", limit, f"{text} ({self.rule})")


def load_gate_file(path: Path) -> list[FileGate]:
    """Read and check a gates YAML before any evaluation runs."""
    data = load_yaml(path, "gate file")
    if isinstance(data, dict) and set(data) == {"gates"}:
        data = data["gates"]
    if not isinstance(data, dict) or not data:
        raise LlmpressError(f"gate file {path}: expected a mapping like `kl: {{max: 0.05}}`")
    gates = []
    for metric, rules in data.items():
        _check_metric(str(metric))
        if not isinstance(rules, dict) or not rules:
            raise LlmpressError(f"{path}: {metric}: expected rules like {{max: 0.05}}")
        for rule, value in rules.items():
            if rule not in RULES:
                raise LlmpressError(f"{path}: {metric}.{rule}: unknown rule; use {RULES}")
            if rule.startswith("max_") and metric not in ORIGINAL:
                raise LlmpressError(
                    f"{path}: {metric}.{rule}: the original has no {metric} to be relative "
                    f"to; use max/min (relative rules work for {', '.join(ORIGINAL)})"
                )
            gates.append(FileGate(str(metric), rule, _amount(value, f"{path}: {metric}.{rule}")))
    return gates


@dataclass(frozen=True)
class Verdict:
    gate: Gate
    value: float
    passed: bool

    def line(self) -> str:
        g = self.gate
        why = f" [{g.rule}]" if g.rule else ""
        word = "PASS" if self.passed else "FAIL"
        return f"{word} {g.metric} = {self.value:.5g} (limit {g.op} {g.threshold:.5g}){why}"

    def to_dict(self) -> dict:
        g = self.gate
        return {
            "metric": g.metric,
            "value": self.value,
            "op": g.op,
            "limit": g.threshold,
            "rule": g.rule or None,
            "pass": self.passed,
        }


def check_gates(gates: list, metrics: dict[str, float]) -> list[Verdict]:
    """Check every gate (inline or from a file) against measured `metrics`."""
    out = []
    for g in gates:
        gate = g.resolve(metrics) if isinstance(g, FileGate) else g
        if gate.metric not in metrics or metrics[gate.metric] is None:
            raise LlmpressError(f"gate on {gate.metric}: not measured for this artifact")
        value = metrics[gate.metric]
        out.append(Verdict(gate, value, gate.check(value)))
    return out
