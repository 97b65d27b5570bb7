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

from compress.kernels.cpu import QuantizedInput, mamba_rows
from compress.runtime.states import MixerStates


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
        """The layer's output before out_proj, [rows, width], for the normed input x (fp32,
        or as the packed linears read it) whose rows `a:b` are tokens of `slot` in order,
        for each (slot, a, b, fresh) of `spans` (fresh: from the start of the sequence)."""
        xf = x.x if isinstance(x, QuantizedInput) else x
        proj = self.in_proj(x)
        out = torch.empty(xf.shape[0], self.width, device=xf.device)
        for slot, a, b, fresh in spans:
            tail, state = states.start(index, slot, fresh)
            if xf.device.type == "cpu":  # in C, each row alike
                mamba_rows(self, proj[a:b], tail, state, out[a:b])
            else:
                out[a:b] = self._rows(proj[a:b], tail, state)
        return out

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
