"""The recurrent state a sequence carries through each layer whose mixer is not attention
(a Gated DeltaNet, a Mamba-2, a short convolution): kept beside the KV cache of the
attention layers, a row per slot, made at first use. A prompt's chunk from position 0
starts from zeros; any other chunk or decode row continues its slot's."""

from __future__ import annotations

import torch


class MixerStates:
    """Every slot's convolution tail [channels, kernel - 1] and state (the mixer's
    `state_shape`) for each recurrent layer, fp32. `nets`: layer index -> its mixer
    (runtime/deltanet.py's DeltaNet, runtime/mamba.py's Mamba2, runtime/short_conv.py's
    ShortConv)."""

    def __init__(self, nets: dict, slots: int, device):
        self.conv = {
            i: torch.zeros(slots, m.channels, m.conv.shape[1] - 1, device=device)
            for i, m in nets.items()
        }
        self.state = {i: torch.zeros(slots, *m.state_shape, device=device) for i, m in nets.items()}

    @property
    def nbytes(self) -> int:
        every = [*self.conv.values(), *self.state.values()]
        return sum(t.numel() * t.element_size() for t in every)

    def start(self, index: int, slot: int, fresh: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `index`'s tail and state of `slot`, zeroed first where `fresh` (a chunk
        from the start of its sequence)."""
        conv, state = self.conv[index][slot], self.state[index][slot]
        if fresh:
            conv.zero_()
            state.zero_()
        return conv, state


def mix_by_rows(mixer, x, spans, states: MixerStates, index: int, c_rows) -> torch.Tensor:
    """A recurrent layer's output before out_proj, [rows, width], for the normed input x
    (fp32, or as the packed linears read it) whose rows `a:b` are tokens of `slot` in order,
    for each (slot, a, b, fresh) of `spans` (fresh: from the start of the sequence): its
    in_proj's rows, then one sequence at a time `c_rows(mixer, proj, tail, state, out)` on
    the CPU (each row alike whatever rows come with it), else the mixer's torch `_rows`."""
    xf = getattr(x, "x", x)  # (a QuantizedInput's fp32 rows)
    proj = mixer.in_proj(x)
    out = torch.empty(xf.shape[0], mixer.width, device=xf.device)
    for slot, a, b, fresh in spans:
        tail, state = states.start(index, slot, fresh)
        if xf.device.type == "cpu":
            c_rows(mixer, proj[a:b], tail, state, out[a:b])
        else:
            out[a:b] = mixer._rows(proj[a:b], tail, state)
    return out


def mixer_kind(layers) -> str | None:
    """What the recurrent layers among runtime `layers` are, for messages (None: none)."""
    return next((x.mixer.kind for x in layers if x.mixer is not None), None)


def states_of(cache, nets: dict) -> MixerStates:
    """The recurrent states beside `cache`, made at first use with a row per slot."""
    states = getattr(cache, "recurrent", None)
    if states is None:
        states = cache.recurrent = MixerStates(nets, cache.lengths.shape[0], cache.lengths.device)
    return states
