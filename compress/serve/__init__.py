"""`llmpress serve`: an OpenAI-compatible HTTP server on the decode runtime."""
