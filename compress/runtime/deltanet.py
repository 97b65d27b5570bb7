"""Gated DeltaNet linear attention (Qwen3.5's `linear_attention` layers) as the runtime
computes it: no keys are cached; each sequence carries, per DeltaNet layer, the last
kernel - 1 inputs of its causal convolution and a state [k_dim, v_dim] per value head
(runtime/states.py, beside the KV cache of the attention layers). A prompt's chunk starting at
position 0 starts from zeros; any other chunk or decode row continues its slot's state.

Per token t (transformers' `torch_recurrent_gated_delta_rule`; its chunked form computes
the same sums reassociated): q, k, v from the convolution of in_proj_qkv's output and
SiLU, q and k L2-normed per head, q times k_dim^-0.5, each key head serving v_heads /
k_heads value heads; β = sigmoid(b), g = -exp(A_log)·softplus(a + dt_bias);
S ← S·exp(g); S ← S + k ⊗ β(v − Sᵀk); out = Sᵀq. Each value head's output is RMS-normed,
times the norm's weight and SiLU(z), before out_proj (the layer's o). On the CPU all of it
but the projections is one C call a sequence (kernels/cpu/deltanet.c), each row computed
alike whatever rows come with it; elsewhere, torch's ops, token by token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from compress.kernels.cpu import QuantizedInput, deltanet_rows
from compress.runtime.states import MixerStates


@dataclass
class DeltaNet:
    """A DeltaNet layer's weights: in_proj_qkv and in_proj_z fused into `qkvz` (one
    product, as o and the MLP read theirs), in_proj_b and in_proj_a stacked in `ba` as
    stored (a router's kind of weight; `ba_weight` its fp32 copy, which the C step reads),
    the rest in fp32."""

    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int
    qkvz: object
    ba: object  # [2 · v_heads, hidden]: b's rows, then a's
    conv: torch.Tensor  # [channels, kernel]
    decay: torch.Tensor  # -exp(A_log) [v_heads]
    dt_bias: torch.Tensor  # [v_heads]
    norm: torch.Tensor  # [v_dim]
    eps: float
    ba_weight: torch.Tensor | None = None  # ba's weight in fp32 (the C step's)
    kind = "Gated DeltaNet"

    @property
    def channels(self) -> int:
        """What the convolution runs over: q, k and v."""
        return 2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim

    @property
    def width(self) -> int:
        """The output's width, what out_proj reads."""
        return self.v_heads * self.v_dim

    @property
    def state_shape(self) -> tuple[int, ...]:
        """A sequence's state: [k_dim, v_dim] per value head."""
        return (self.v_heads, self.k_dim, self.v_dim)

    def extra_linears(self) -> tuple:
        """Its linears besides qkv (the fused in_proj_qkv and in_proj_z) and o."""
        return (self.ba,)

    def held(self) -> tuple[torch.Tensor, ...]:
        """Its tensors besides the linears a step reads."""
        return (self.norm, self.conv)

    def mix(self, x, spans, states: MixerStates, index: int) -> torch.Tensor:
        return mix(self, x, spans, states, index)

    @property
    def state_bytes(self) -> int:
        """A sequence's state and convolution tail (fp32): what a decode step reads, and
        writes back, for each sequence, as attention reads its KV cache."""
        return 4 * (
            self.v_heads * self.k_dim * self.v_dim + self.channels * (self.conv.shape[1] - 1)
        )


def _l2(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def recurrence(s, q, k, v, g, beta) -> tuple[torch.Tensor, torch.Tensor]:
    """The delta rule token by token in torch: (the state after, the outputs [T, H, V])."""
    out = torch.empty_like(v)
    for r in range(v.shape[0]):
        s = s * torch.exp(g[r])[:, None, None]
        kv = torch.einsum("hk,hkv->hv", k[r], s)
        s = s + k[r][:, :, None] * ((v[r] - kv) * beta[r][:, None])[:, None, :]
        out[r] = torch.einsum("hk,hkv->hv", q[r], s)
    return s, out


def mix(dn: DeltaNet, x, spans, states: MixerStates, index: int) -> torch.Tensor:
    """The layer's output before out_proj, [rows, v_heads · v_dim], for the normed input x
    (fp32, or as the packed linears read it) whose rows `a:b` are tokens of `slot` in order,
    for each (slot, a, b, fresh) of `spans` (fresh: from the start of the sequence)."""
    xf = x.x if isinstance(x, QuantizedInput) else x
    qkvz = dn.qkvz(x)
    mixed, z = qkvz.split([dn.channels, dn.width], -1)
    if xf.device.type == "cpu" and dn.ba_weight is not None:  # in C, each row alike
        out = torch.empty(xf.shape[0], dn.width)
        for slot, a, b, fresh in spans:
            tail, state = states.start(index, slot, fresh)
            deltanet_rows(dn, mixed[a:b], z[a:b], xf[a:b], tail, state, out[a:b])
        return out
    conv, state = states.conv[index], states.state[index]
    ba = dn.ba(xf)
    beta = torch.sigmoid(ba[:, : dn.v_heads])
    g = dn.decay * F.softplus(ba[:, dn.v_heads :] + dn.dt_bias)
    out = torch.empty(xf.shape[0], dn.v_heads, dn.v_dim, device=xf.device)
    kernel = dn.conv.shape[1]
    for slot, a, b, fresh in spans:
        if fresh:
            conv[slot].zero_()
            state[slot].zero_()
        window = torch.cat((conv[slot], mixed[a:b].T), 1)  # [channels, kernel - 1 + T]
        conv[slot] = window[:, window.shape[1] - (kernel - 1) :]
        rows = F.conv1d(window[None], dn.conv[:, None], groups=dn.channels)[0].T  # [T, ch]
        q, k, v = F.silu(rows).split([dn.k_heads * dn.k_dim] * 2 + [dn.width], -1)
        t, group = b - a, dn.v_heads // dn.k_heads
        q = _l2(q.reshape(t, dn.k_heads, dn.k_dim)).repeat_interleave(group, 1)
        k = _l2(k.reshape(t, dn.k_heads, dn.k_dim)).repeat_interleave(group, 1)
        q, v = q * dn.k_dim**-0.5, v.reshape(t, dn.v_heads, dn.v_dim).contiguous()
        state[slot], out[a:b] = recurrence(state[slot], q, k, v, g[a:b], beta[a:b])
    normed = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + dn.eps) * dn.norm
    gate = F.silu(z.reshape(-1, dn.v_heads, dn.v_dim))
    return (normed * gate).reshape(-1, dn.width)
