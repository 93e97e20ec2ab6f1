"""Generating tokens with a decoder LM's prefill and decode graphs (a KV
cache): ``loop`` runs the steps, ``sampling`` holds the token pickers it
calls as ``pick(logits, history) -> ids`` (``greedy`` and the seeded
``Sampler``)."""
from .loop import Generation, generate  # noqa: F401
from .sampling import Sampler, greedy  # noqa: F401
