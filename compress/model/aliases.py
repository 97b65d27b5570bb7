"""A block's modules under the names checkpoints give them, where transformers' model
names them otherwise (MiniCPM5-MoE's q_proj, which its model calls q_gate_proj and
renames on load): every llmpress consumer then reads, quantizes and writes the tensor
under the checkpoint's name, and transformers' forward still finds its attribute."""

from __future__ import annotations

from torch import nn


def install_aliases(model: nn.Module, adapter) -> None:
    """Register each aliased module of every block under its checkpoint name (for
    state_dict, get_submodule and the writer), keeping transformers' attribute as a plain
    reference to the same module (for its forward)."""
    if not adapter.module_aliases:
        return
    for i in range(model.config.num_hidden_layers):
        block = model.get_submodule(adapter.block_prefix(i))
        for stored, attribute in adapter.module_aliases:
            parent_path, _, name = stored.rpartition(".")
            old = attribute.rpartition(".")[2]  # (both under the same parent)
            parent = block.get_submodule(parent_path) if parent_path else block
            module = parent._modules.pop(old)
            parent._modules[name] = module
            object.__setattr__(parent, old, module)
