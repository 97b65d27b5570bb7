"""LFM2's gated short convolution (its `conv` layers) as the runtime computes it: no keys
are cached; each sequence carries, per such layer, the last kernel − 1 values of B·x
(runtime/states.py). Per token: in_proj gives B, C and x; y = C · conv(B·x) over the
sequence's tail, then out_proj (the layer's o). On the CPU all of it but the projections
is one C call a sequence (kernels/cpu/short_conv.c); elsewhere, torch's ops.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from compress.kernels.cpu import short_conv_rows
from compress.runtime.states import MixerStates, mix_by_rows


@dataclass
class ShortConv:
    """A short-convolution layer's weights: in_proj (packed, as the layer's qkv), the
    convolution's [width, kernel] in fp32."""

    width: int
    in_proj: object
    conv: torch.Tensor  # [width, kernel]
    kind = "short-convolution"

    @property
    def channels(self) -> int:
        return self.width

    @property
    def state_shape(self) -> tuple[int, ...]:
        return (0,)  # (its tail alone)

    @property
    def state_bytes(self) -> int:
        """A sequence's tail (fp32): what a decode step reads, and writes back."""
        return 4 * self.width * (self.conv.shape[1] - 1)

    def extra_linears(self) -> tuple:
        return ()

    def held(self) -> tuple[torch.Tensor, ...]:
        return (self.conv,)

    def mix(self, x, spans, states: MixerStates, index: int) -> torch.Tensor:
        """The layer's output before out_proj (states.mix_by_rows): in C on the CPU."""
        return mix_by_rows(self, x, spans, states, index, _c_rows)

    def _rows(self, proj, tail, state=None) -> torch.Tensor:
        """One sequence's rows in torch's ops; the tail in place."""
        b, c, x = proj.split([self.width] * 3, -1)
        kernel = self.conv.shape[1]
        window = torch.cat((tail, (b * x).T), 1)  # [width, kernel - 1 + T]
        tail.copy_(window[:, window.shape[1] - (kernel - 1) :])
        conv = F.conv1d(window[None], self.conv[:, None], groups=self.width)[0].T
        return c * conv


def _c_rows(m: ShortConv, proj, tail, state, out) -> None:
    short_conv_rows(m, proj, tail, out)  # (its state is its tail alone)
