"""The built-in backends, one module each; importing this package registers
them, in the order the CLI and ``blockc compare`` list them. The interface
and the registry are in ``runtime/backend.py``."""
from . import reference, ort, cuda, pytorch  # noqa: F401  (registration side effects, in this order)
