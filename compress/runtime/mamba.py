"""Mamba-2 (Bamba's and Granite 4.0's `linear_attention` layers) as the runtime computes
it: no keys are cached; each sequence carries, per Mamba layer, the last kernel - 1 inputs
of its causal convolution and a state [head_dim, state] per head (runtime/states.py).

Per token t (transformers' `mamba2_selective_state_update`; its chunked scan computes the
same sums reassociated): in_proj gives z, x·B·C and dt; x, B and C through the
convolution (its bias) and SiLU; dt = softplus(dt + dt_bias); per head h, of group
g = h / (heads / groups): S ← S·exp(dt·A) + dt·x_h ⊗ B_g, y_h = S·C_g + D_h·x_h, with
A = −exp(A_log). y times SiLU(z), RMS-normed over each group's heads, times the norm's
weight, goes to out_proj (the layer's o). On the CPU all of it but the projections is one
C call a sequence (kernels/cpu/mamba.c), each row computed alike whatever rows come with
it; elsewhere, torch's ops, token by token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from compress.kernels.cpu import mamba1_rows, mamba_rows
from compress.runtime.states import MixerStates, mix_by_rows


@dataclass
class Mamba2:
    """A Mamba-2 layer's weights: in_proj (packed, as the layer's qkv), the rest fp32."""

    heads: int
    head_dim: int
    state_size: int
    groups: int
    in_proj: object
    conv: torch.Tensor  # [channels, kernel]
    conv_bias: torch.Tensor  # [channels] (zeros where the layer has none)
    decay: torch.Tensor  # A = -exp(A_log) [heads]
    dt_bias: torch.Tensor  # [heads]
    d: torch.Tensor  # [heads]: the skip's weight
    norm: torch.Tensor  # [heads · head_dim]
    eps: float
    kind = "Mamba-2"

    @property
    def width(self) -> int:
        return self.heads * self.head_dim

    @property
    def channels(self) -> int:
        """What the convolution runs over: x, B and C."""
        return self.width + 2 * self.groups * self.state_size

    @property
    def state_shape(self) -> tuple[int, ...]:
        return (self.heads, self.head_dim, self.state_size)

    @property
    def state_bytes(self) -> int:
        """A sequence's state and convolution tail (fp32): what a decode step reads, and
        writes back, for each sequence."""
        return 4 * (
            self.heads * self.head_dim * self.state_size + self.channels * (self.conv.shape[1] - 1)
        )

    def extra_linears(self) -> tuple:
        return ()

    def held(self) -> tuple[torch.Tensor, ...]:
        return (self.norm, self.conv, self.conv_bias, self.decay, self.dt_bias, self.d)

    def mix(self, x, spans, states: MixerStates, index: int) -> torch.Tensor:
        """The layer's output before out_proj (states.mix_by_rows): in C on the CPU."""
        return mix_by_rows(self, x, spans, states, index, mamba_rows)

    def _rows(self, proj, tail, state) -> torch.Tensor:
        """One sequence's rows in torch's ops, token by token; tail and state in place."""
        z, xbc, dt = proj.split([self.width, self.channels, self.heads], -1)
        kernel, t = self.conv.shape[1], proj.shape[0]
        window = torch.cat((tail, xbc.T), 1)  # [channels, kernel - 1 + T]
        tail.copy_(window[:, window.shape[1] - (kernel - 1) :])
        conv = F.conv1d(window[None], self.conv[:, None], self.conv_bias, groups=self.channels)
        xs, bs, cs = F.silu(conv[0].T).split(
            [self.width, *(2 * [self.groups * self.state_size])], -1
        )
        dt = F.softplus(dt + self.dt_bias)  # [T, heads]
        per = self.heads // self.groups
        xs = xs.reshape(t, self.heads, self.head_dim)
        bs = bs.reshape(t, self.groups, self.state_size).repeat_interleave(per, 1)
        cs = cs.reshape(t, self.groups, self.state_size).repeat_interleave(per, 1)
        ys = torch.empty_like(xs)
        s = state
        for r in range(t):
            s = s * torch.exp(dt[r] * self.decay)[:, None, None]
            s = s + (dt[r][:, None] * xs[r])[:, :, None] * bs[r][:, None, :]
            ys[r] = torch.einsum("hds,hs->hd", s, cs[r]) + self.d[:, None] * xs[r]
        state.copy_(s)
        y = ys.reshape(t, self.width) * F.silu(z)
        g = y.reshape(t, self.groups, -1)
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)
        return g.reshape(t, self.width) * self.norm


@dataclass
class Mamba1:
    """A Mamba (selective scan) layer's weights, as Jamba's: in_proj packed (the layer's
    qkv), x_proj and dt_proj fp32 as stored (they read the scan's own rows), the rest fp32.
    Per token: x, z = in_proj; x through the convolution and SiLU; dt, B, C = x_proj(x),
    each RMS-normed; dt = softplus(dt_proj(dt) + dt_bias) per channel; per channel
    S ← S·exp(dt·A) + dt·x·B, y = S·C + D·x, times SiLU(z)."""

    width: int
    state_size: int
    rank: int
    in_proj: object
    x_proj: torch.Tensor  # [rank + 2 · state, width]
    dt_proj: torch.Tensor  # [width, rank]
    dt_bias: torch.Tensor  # [width]
    conv: torch.Tensor  # [width, kernel]
    conv_bias: torch.Tensor  # [width] (zeros where the layer has none)
    decay: torch.Tensor  # A = -exp(A_log) [width, state]
    d: torch.Tensor  # [width]
    norms: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # dt's [rank], B's and C's [state]
    eps: float
    kind = "Mamba"

    @property
    def channels(self) -> int:
        return self.width

    @property
    def state_shape(self) -> tuple[int, ...]:
        return (self.width, self.state_size)

    @property
    def state_bytes(self) -> int:
        """A sequence's state and convolution tail (fp32), read and written each step."""
        return 4 * (self.width * self.state_size + self.width * (self.conv.shape[1] - 1))

    def extra_linears(self) -> tuple:
        return ()

    def held(self) -> tuple[torch.Tensor, ...]:
        every = (self.x_proj, self.dt_proj, self.dt_bias, self.conv, self.conv_bias)
        return (*every, self.decay, self.d, *self.norms)

    def mix(self, x, spans, states: MixerStates, index: int) -> torch.Tensor:
        """The layer's output before out_proj (states.mix_by_rows): in C on the CPU."""
        return mix_by_rows(self, x, spans, states, index, mamba1_rows)

    def _rows(self, proj, tail, state) -> torch.Tensor:
        """One sequence's rows in torch's ops, token by token; tail and state in place."""
        xs, z = proj.split([self.width, self.width], -1)
        kernel, t = self.conv.shape[1], proj.shape[0]
        window = torch.cat((tail, xs.T), 1)
        tail.copy_(window[:, window.shape[1] - (kernel - 1) :])
        conv = F.conv1d(window[None], self.conv[:, None], self.conv_bias, groups=self.width)
        xs = F.silu(conv[0].T)  # [T, width]
        dt, bs, cs = (xs @ self.x_proj.T).split([self.rank, self.state_size, self.state_size], -1)
        dt, bs, cs = (_rms(v, w, self.eps) for v, w in zip((dt, bs, cs), self.norms, strict=True))
        dt = F.softplus(dt @ self.dt_proj.T + self.dt_bias)  # [T, width]
        ys, s = torch.empty_like(xs), state
        for r in range(t):
            s = s * torch.exp(dt[r][:, None] * self.decay) + (dt[r] * xs[r])[:, None] * bs[r]
            ys[r] = s @ cs[r] + self.d * xs[r]
        state.copy_(s)
        return ys * F.silu(z)


def _rms(v: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * w
