"""The built-in backends, one module each, each declaring the names it runs
by (``REGISTRATIONS``), listed here in the order the CLI and ``blockc
compare`` show them. They import the interface (``runtime/interface.py``);
the registry (``runtime/backend.py``) imports this package and registers them."""
from . import cuda, ort, pytorch, reference

REGISTRATIONS = reference.REGISTRATIONS + ort.REGISTRATIONS + cuda.REGISTRATIONS + pytorch.REGISTRATIONS
