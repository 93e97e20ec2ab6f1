"""Generating tokens with a decoder LM's prefill and decode graphs (a KV cache)."""
from .loop import Generation, generate, greedy  # noqa: F401
