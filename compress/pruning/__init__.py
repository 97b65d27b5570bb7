"""Structured pruning: importance scores, planning the new shape, surgery."""
