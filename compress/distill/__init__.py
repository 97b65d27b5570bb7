"""Distillation repair: the original model teaches the compressed one."""
