"""Checkpoints: where they come from (folder, hub id, GGUF, default) and how they are laid out."""

from compress.model.adapters import Adapter, adapter_for
from compress.model.loading import Checkpoint, load_tokenizer, resolve

__all__ = ["Adapter", "Checkpoint", "adapter_for", "load_tokenizer", "resolve"]
