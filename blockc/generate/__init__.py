"""Generating tokens with a decoder LM's prefill and decode graphs (a KV
cache): ``loop`` runs the steps, ``sampling`` holds the token pickers it
calls as ``pick(logits, history) -> ids`` (``greedy`` and the seeded
``Sampler``, which runs ``processors``' logits processors), ``stopping``
the criteria that finish rows, ``cache`` the kinds of KV cache."""
from .cache import CacheKind  # noqa: F401
from .loop import Generation, generate  # noqa: F401
from .processors import LogitsProcessor, LogitsProcessorList  # noqa: F401
from .sampling import Sampler, greedy  # noqa: F401
from .stopping import MaxTime, StoppingCriterion, StopStrings  # noqa: F401
