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


def mixer_kind(layers) -> str | None:
    """What the recurrent layers among runtime `layers` are, for messages (None: none)."""
    return next((x.mixer.kind for x in layers if x.mixer is not None), None)


def states_of(cache, nets: dict) -> MixerStates:
    """The recurrent states beside `cache`, made at first use with a row per slot."""
    states = getattr(cache, "recurrent", None)
    if states is None:
        states = cache.recurrent = MixerStates(nets, cache.lengths.shape[0], cache.lengths.device)
    return states
