"""The decode runtime: an artifact's weights as stored, a KV cache, and a batched engine."""

from compress.runtime.engine import Engine, Request, SamplingParams
from compress.runtime.weights import load_weights

__all__ = ["Engine", "Request", "SamplingParams", "load_weights"]
