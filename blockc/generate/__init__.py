"""Generation: choosing tokens from a model's logits, step after step.

``sampling`` holds the token pickers a generation loop calls as
``pick(logits, history) -> ids``: ``greedy`` and the seeded ``Sampler``.
"""
from .sampling import Sampler, greedy  # noqa: F401
