"""Drift of compressed models against the original, window by window.

Every window's logits from the original are computed once and compared with each
candidate, so measuring several variants costs one extra forward each, not two.
Per window of L tokens, the L-1 next-token predictions are scored:
  perplexity  exp(mean NLL of the true next token)
  KL          mean over tokens of KL(original ‖ candidate), full vocabulary, nats
  top-1       share of tokens where both models' argmax agree
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch
from tqdm.auto import tqdm

from compress.allocator import THRESHOLD, heap_blocks
from compress.kernels.cpu import argmax_rows, divergence_rows, log_softmax_rows_


@dataclass
class Drift:
    ppl: float
    base_ppl: float
    kl: float
    top1: float
    tokens: int
    windows: int
    ctx: int
    data: str = ""
    # what computed the candidate's logits: "served" (the kernels bench and serve run),
    # "exact" (fp32 activations, dequantized weights), or "transformers"
    kernels: str = ""
    activations: str = ""
    kv_cache: str = ""  # the KV cache it ran: "int8", "int4"; "" for fp32
    # the exact figure measured beside the served one: {ppl, kl, top1, ...}
    weights_only: dict | None = None
    # where the original's figures came from: "computed" (block by block), or "cached"
    # (its final hidden states; eval/reference.py)
    reference: str = "computed"

    @property
    def ppl_ratio(self) -> float:
        return self.ppl / self.base_ppl

    def metrics(self) -> dict[str, float]:
        """The numbers gates can test."""
        return {
            "ppl": self.ppl,
            "base_ppl": self.base_ppl,
            "ppl_ratio": self.ppl_ratio,
            "kl": self.kl,
            "top1": self.top1,
        }

    def to_dict(self) -> dict:
        return {**asdict(self), "ppl_ratio": self.ppl_ratio}


def _rows(t: torch.Tensor) -> int:
    """Rows of a [rows, vocab] slice whose fp32 temporaries stay under half the allocator's
    mmap threshold (compress/allocator.py): the heap hands the same memory back slice after
    slice, where 64-row slices (12.6 MB at a 49k vocabulary) were mapped and page-faulted
    afresh, as were whole-window log-softmax outputs."""
    return max(1, THRESHOLD // 2 // (4 * t.shape[-1]))


def log_softmax_(logits: torch.Tensor) -> torch.Tensor:
    """log_softmax over the last dim of fp32 logits [rows, vocab], in place: in C on the
    CPU, as divergence_rows normalizes a candidate's logits; elsewhere torch's, a slice of
    rows at a time (rows are independent: the values of one whole call)."""
    if log_softmax_rows_(logits):
        return logits
    step = _rows(logits)
    for lo in range(0, logits.shape[0], step):
        part = logits[lo : lo + step]
        part.copy_(torch.log_softmax(part, dim=-1))
    return logits


@torch.no_grad()
def _logits(model, window: torch.Tensor) -> torch.Tensor:
    """The next-token logits [L-1, vocab] of a window, fp32."""
    return model(input_ids=window.unsqueeze(0)).logits[0, :-1].float().contiguous()


def _logprobs(model, window: torch.Tensor) -> torch.Tensor:
    return log_softmax_(_logits(model, window))


@torch.no_grad()
def measure_drift(
    base,
    candidates: dict,
    windows: torch.Tensor,
    data: str = "",
    progress: bool = True,
    token_kl: dict | None = None,
) -> dict[str, Drift]:
    """Drift of each candidate model (by name) against `base` over `windows` [n, ctx].
    `base` is a model, or an object whose `reference(i, window)` gives window i's
    log-probs (eval/reference.py: block by block, or from the cache). `token_kl`, if
    given, receives each candidate's per-token KL (for distributions)."""
    n, ctx = windows.shape
    sums = {name: {"nll": 0.0, "kl": 0.0, "agree": 0} for name in candidates}
    base_nll = 0.0
    tokens = 0
    own = hasattr(base, "reference")
    with heap_blocks():  # the same tensors every window: from the heap, not mapped afresh
        for i, window in enumerate(
            tqdm(windows, desc="eval windows", unit="win", disable=not progress)
        ):
            targets = window[1:]
            ref = base.reference(i, window) if own else _logprobs(base, window)
            ref_top = argmax_rows(ref)
            base_nll -= ref.gather(-1, targets[:, None]).sum().item()
            tokens += targets.numel()
            for name, model in candidates.items():
                logits = _logits(model, window)
                per_token, lse, top = divergence_rows(ref, logits)
                s = sums[name]
                # the target's log-prob as log_softmax_ gives the original's: c - (float) lse
                s["nll"] -= (logits.gather(-1, targets[:, None])[:, 0] - lse.float()).sum().item()
                s["kl"] += per_token.sum().item()
                if token_kl is not None:
                    token_kl.setdefault(name, []).append(per_token.float())
                s["agree"] += (top == ref_top).sum().item()
    base_ppl = float(torch.tensor(base_nll / tokens).exp())
    if token_kl is not None:
        for name in list(token_kl):
            token_kl[name] = torch.cat(token_kl[name])
    return {
        name: Drift(
            ppl=float(torch.tensor(s["nll"] / tokens).exp()),
            base_ppl=base_ppl,
            kl=s["kl"] / tokens,
            top1=s["agree"] / tokens,
            tokens=tokens,
            windows=n,
            ctx=ctx,
            data=data,
        )
        for name, s in sums.items()
    }


def format_table(results: dict[str, Drift], extra: dict[str, dict] | None = None) -> str:
    """A Markdown table, one row per candidate (extra columns per row optional)."""
    extra = extra or {}
    extra_cols = sorted({k for row in extra.values() for k in row})
    head = ["model", "ppl", "base ppl", "ppl ratio", "KL", "top-1", *extra_cols]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, d in results.items():
        cells = [
            name,
            f"{d.ppl:.3f}",
            f"{d.base_ppl:.3f}",
            f"{d.ppl_ratio:.4f}",
            f"{d.kl:.5f}",
            f"{d.top1:.4f}",
            *[str(extra.get(name, {}).get(c, "")) for c in extra_cols],
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


_LABELS = {
    "served": ("as served", "int8 activations"),
    "exact": ("weights only", "exact"),
    "transformers": ("transformers", None),
}


def computed_by(kernels: str, kv_cache: str = "", labels: dict = _LABELS) -> str:
    """What computed a row: the kernels, and a quantized KV cache where one ran."""
    head, detail = labels.get(kernels, (kernels, None))
    notes = [n for n in (detail, kv_cache and f"{kv_cache} KV cache") if n]
    return f"{head} ({', '.join(notes)})" if notes else head


def drift_rows(name: str, drift: Drift) -> dict[str, Drift]:
    """Table rows for one evaluation: the gated figure, and the weights-only one beside it
    when both were measured, each labelled with what computed it."""
    rows = {f"{name}, {computed_by(drift.kernels, drift.kv_cache)}".rstrip(", "): drift}
    if drift.weights_only:
        other = {k: v for k, v in drift.weights_only.items() if k != "ppl_ratio"}
        exact = replace(drift, **other, kernels="exact", weights_only=None)
        rows[f"{name}, {computed_by('exact', exact.kv_cache)}"] = exact
    return rows
