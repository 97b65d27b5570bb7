"""Server metrics in Prometheus' text exposition format (no client library needed)."""

from __future__ import annotations

import threading
from bisect import bisect_left

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TPOT_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)


class Histogram:
    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...]):
        self.name, self.help, self.buckets = name, help_text, buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.sum += value

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        total = 0
        for bound, count in zip((*self.buckets, float("inf")), self.counts, strict=True):
            total += count
            le = "+Inf" if bound == float("inf") else f"{bound:g}"
            lines.append(f'{self.name}_bucket{{le="{le}"}} {total}')
        lines += [f"{self.name}_sum {self.sum:.6f}", f"{self.name}_count {total}"]
        return lines


class Metrics:
    """Updated by the scheduler thread, read by request handlers: one lock."""

    def __init__(self, slots: int):
        self.lock = threading.Lock()
        self.slots = slots
        self.ttft = Histogram(
            "llmpress_time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS
        )
        self.tpot = Histogram(
            "llmpress_time_per_output_token_seconds", "Time per output token.", TPOT_BUCKETS
        )
        self.counters = {"requests_total": 0, "rejected_total": 0, "generated_tokens_total": 0}
        self.gauges = {"requests_running": 0, "requests_queued": 0, "kv_cache_slots_in_use": 0}
        self.tokens_per_s = 0.0

    def render(self) -> str:
        with self.lock:
            lines = self.ttft.render() + self.tpot.render()
            for name, value in self.counters.items():
                lines += [f"# TYPE llmpress_{name} counter", f"llmpress_{name} {value}"]
            for name, value in {**self.gauges, "kv_cache_slots": self.slots}.items():
                lines += [f"# TYPE llmpress_{name} gauge", f"llmpress_{name} {value}"]
            lines += [
                "# HELP llmpress_tokens_per_second Output tokens per second, last 5 s.",
                "# TYPE llmpress_tokens_per_second gauge",
                f"llmpress_tokens_per_second {self.tokens_per_s:.3f}",
            ]
        return "\n".join(lines) + "\n"
