"""Quality gates: `kl<=0.05,ppl_ratio<=1.05` → pass/fail per metric, for CI."""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass

from compress.errors import LlmpressError

METRICS = ("ppl", "base_ppl", "ppl_ratio", "kl", "top1")
_OPS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}
_GATE = re.compile(r"^\s*([a-z_0-9]+)\s*(<=|>=|<|>)\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?\d+)?)\s*$")


@dataclass(frozen=True)
class Gate:
    metric: str
    op: str
    threshold: float

    def check(self, value: float) -> bool:
        return _OPS[self.op](value, self.threshold)

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.threshold:g}"


def parse_gates(expr: str) -> list[Gate]:
    gates = []
    for part in expr.split(","):
        m = _GATE.match(part)
        if not m:
            raise LlmpressError(
                f"bad gate {part.strip()!r}: write METRIC OP NUMBER, e.g. 'kl<=0.05,top1>=0.9' "
                f"(metrics: {', '.join(METRICS)}; ops: <=, <, >=, >)"
            )
        metric, op, value = m.groups()
        if metric not in METRICS:
            raise LlmpressError(f"unknown gate metric {metric!r}; use one of {', '.join(METRICS)}")
        gates.append(Gate(metric, op, float(value)))
    return gates


def check_gates(gates: list[Gate], metrics: dict[str, float]) -> list[tuple[Gate, float, bool]]:
    return [(g, metrics[g.metric], g.check(metrics[g.metric])) for g in gates]
