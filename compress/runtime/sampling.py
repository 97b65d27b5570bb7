"""Next-token choice: greedy, or temperature / top-k / top-p sampling with a per-request seed."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from compress.draw import draw as draw_tokens
from compress.kernels.cpu import argmax, choose_tokens


@dataclass
class SamplingParams:
    max_tokens: int = 128
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: no limit
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False  # benchmarks generate exactly max_tokens
    # log-probabilities of the model's own distribution (before temperature, top-k, top-p),
    # for clients that score text: each new token's and its `logprobs` most likely
    # alternatives (None: none recorded); `prompt_logprobs`: also every prompt token's
    # after the first, with `logprobs` alternatives (max_tokens may then be 0: score only)
    logprobs: int | None = None
    prompt_logprobs: bool = False

    def __post_init__(self):
        finite = math.isfinite(self.temperature) and math.isfinite(self.top_p)
        if (
            not finite
            or self.temperature < 0
            or not 0 < self.top_p <= 1
            or self.top_k < 0
            or self.max_tokens < (0 if self.prompt_logprobs else 1)
            or (self.logprobs is not None and self.logprobs < 0)
        ):
            raise ValueError(
                "sampling parameters out of range: finite temperature >= 0, 0 < top_p <= 1, "
                "top_k >= 0, logprobs >= 0, max_tokens >= 1 (0 only to score a prompt)"
            )


@dataclass
class TokenLogprob:
    """A token's log-probability under the model, and the `top` most likely tokens' as
    (id, log-probability), most likely first."""

    logprob: float
    top: list[tuple[int, float]]


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, top: int) -> list[TokenLogprob]:
    """For rows of logits [N, vocab] and the token each row chose or was followed by [N]:
    log_softmax in float32, row by row (a whole prompt's [T, vocab] float64 copy would be
    large)."""
    out = []
    for row, token in zip(logits, tokens.tolist(), strict=True):
        lp = torch.log_softmax(row.float(), -1)
        best = torch.topk(lp, top)
        pairs = list(zip(best.indices.tolist(), best.values.tolist(), strict=True))
        out.append(TokenLogprob(float(lp[token]), pairs))
    return out


def _tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """(logits - max) / temperature, a float64 copy. In float64, less the max: a tiny
    temperature (1e-300 is 0 in float32) then sends every other logit to -inf and never
    makes inf - inf (NaN): the limit, greedy."""
    scaled = logits.to(torch.float64, copy=True)
    return scaled.sub_(scaled.max()).div_(temperature)


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a sampled token is drawn from, float64 [vocab]: temperature, then
    top-k, then top-p (sampling only; greedy has none)."""
    logits = _tempered(logits, params.temperature)
    if params.top_k:
        kth = torch.topk(logits, min(params.top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, -1)
    if params.top_p < 1:
        sorted_p, order = probs.sort(descending=True)
        keep = sorted_p.cumsum(0) - sorted_p < params.top_p  # the smallest set reaching top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
    return probs


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from a distribution [vocab] (compress.draw: not torch.multinomial, which
    took 2 ms a call here)."""
    return int(draw_tokens(probs, generator))


# 1 / temperature beyond which a row is tempered in float64 (_tempered) rather than in C's
# float32: a tinier temperature's limit is greedy, and float32 cannot hold its inverse
MAX_INVERSE_TEMPERATURE = 1e30


def _in_c(logits: torch.Tensor, params: SamplingParams) -> bool:
    """Whether llmp_choose_tokens takes rows of `logits` with these parameters: float32 on
    the CPU, greedy or at a temperature float32 can invert."""
    return (
        logits.device.type == "cpu"
        and logits.dtype == torch.float32
        and (params.temperature == 0 or 1 / params.temperature <= MAX_INVERSE_TEMPERATURE)
    )


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token from logits [vocab]. On the CPU: the row as sample_rows draws it in a
    batch (the same token for the same generator). Otherwise (and for a temperature too
    tiny for float32) the tempered distribution in float64, drawn from unnormalized where
    there is neither top-k nor top-p (the draw divides by its total itself)."""
    if params.temperature == 0:
        return argmax(logits)
    if _in_c(logits, params):
        (token,) = sample_rows(logits[None], [params], [generator])
        if token is None:
            raise ValueError("cannot draw a token: a distribution is all zeros or not finite")
        return token
    if params.top_k == 0 and params.top_p == 1:
        return draw(_tempered(logits, params.temperature).exp_(), generator)
    return draw(probabilities(logits, params), generator)


def sample_rows(logits: torch.Tensor, params: list[SamplingParams], generators: list) -> list:
    """The tokens of a step's rows, logits [B, vocab]: rows on the CPU in one C call
    (llmp_choose_tokens: temperature, top-k and top-p as `probabilities` applies them; a
    sampled row takes one float64 uniform from its generator, in row order, as the draw
    does), the others None: for `sample`, row by row, as are rows with nothing to draw
    (their error is theirs alone). Row by row in torch, 32 sampled rows took a tenth of a
    batch-32 decode step, and with top-p (a sort of the vocabulary) three times one."""
    if len(params) == 1 and params[0].temperature == 0:  # one greedy row: no call to gather
        return [argmax(logits[0])]
    taken, inverse, uniforms = [], [], []
    for i, p in enumerate(params):
        if not _in_c(logits, p):
            continue
        u = 0.0
        if p.temperature:
            try:
                u = float(torch.rand(1, dtype=torch.float64, generator=generators[i]))
            except (TypeError, RuntimeError):  # a broken generator: its row fails alone
                continue
        taken.append(i)
        inverse.append(0.0 if p.temperature == 0 else 1 / p.temperature)
        uniforms.append(u)
    if not taken:
        return [None] * len(params)
    rows = logits if len(taken) == len(params) else logits[taken]
    top_k, top_p = [params[i].top_k for i in taken], [params[i].top_p for i in taken]
    chosen = choose_tokens(rows.contiguous(), inverse, uniforms, top_k, top_p)
    out: list = [None] * len(params)
    for i, token in zip(taken, chosen, strict=True):
        out[i] = token if token >= 0 else None
    return out


def accept_drafts(
    logits: torch.Tensor,
    drafts: list[int],
    draft_probs: torch.Tensor | None,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """Speculative decoding's check (Leviathan et al. 2023; Chen et al. 2023): the target's
    logits [k + 1, vocab] after each of k drafted tokens' prefixes. Returns how many drafts
    are kept and the token that follows them, so that the output has exactly the target's
    distribution: greedy keeps drafts while they are the target's argmax; sampling keeps
    draft i with probability min(1, p(d) / q(d)) and on the first refusal draws from
    max(0, p - q), renormalized. `draft_probs` [k, vocab] is q (None: a deterministic
    proposer, q one-hot on its token); after k kept drafts the last row is sampled."""
    if params.temperature == 0:
        best = logits.argmax(-1).tolist()
        for i, d in enumerate(drafts):
            if best[i] != d:
                return i, best[i]
        return len(drafts), best[len(drafts)]
    for i, d in enumerate(drafts):
        p = probabilities(logits[i], params)
        if draft_probs is None:
            q = torch.zeros_like(p)
            q[d] = 1.0
        else:
            q = draft_probs[i].double()
        u = torch.rand(1, dtype=torch.float64, generator=generator).item()
        if u * q[d] < p[d]:  # u < p(d) / q(d), without dividing by a zero q
            continue
        residual = (p - q).clamp_min(0)
        total = residual.sum()
        residual = p if total <= 0 else residual / total
        return i, draw(residual, generator)
    return len(drafts), draw(probabilities(logits[-1], params), generator)
