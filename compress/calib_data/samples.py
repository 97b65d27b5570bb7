"""Token streams cut into fixed-length samples: random and seeded for calibration,
consecutive and non-overlapping for evaluation."""

from __future__ import annotations

import torch

from compress.errors import LlmpressError


def token_stream(tokenizer, texts: list[str]) -> torch.Tensor:
    """All documents tokenized and joined (end-of-sequence token between documents)."""
    sep = tokenizer.eos_token_id
    ids: list[int] = []
    for i, text in enumerate(texts):
        if i and sep is not None:
            ids.append(sep)
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
    return torch.tensor(ids, dtype=torch.long)


def calibration_samples(stream: torch.Tensor, n: int, length: int, seed: int) -> torch.Tensor:
    """`n` windows of `length` tokens at seeded random offsets: [n, length]."""
    if stream.numel() < length:
        raise LlmpressError(
            f"calibration text has {stream.numel()} tokens but one sample needs {length}: "
            "give more text or lower the sample length"
        )
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, stream.numel() - length + 1, (n,), generator=gen)
    return torch.stack([stream[s : s + length] for s in starts.tolist()])


def eval_windows(stream: torch.Tensor, ctx: int, limit: int | None = None) -> torch.Tensor:
    """Consecutive non-overlapping windows of `ctx` tokens from the start: [windows, ctx]."""
    count = stream.numel() // ctx
    if limit is not None:
        count = min(count, limit)
    if count == 0:
        raise LlmpressError(
            f"evaluation text has {stream.numel()} tokens, fewer than one window of {ctx}: "
            "give more text or lower --ctx"
        )
    return stream[: count * ctx].reshape(count, ctx)
