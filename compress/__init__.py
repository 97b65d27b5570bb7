"""llmpress: compress a language model and measure what the compression cost in quality."""

__version__ = "0.1.0"
