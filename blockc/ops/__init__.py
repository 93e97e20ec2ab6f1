"""The op declarations: importing this package imports every module in it,
and so registers every op. A new op is one new file here (or a few lines in
an existing one); nothing else lists the modules."""
import importlib
import pkgutil

from . import registry  # noqa: F401
from .registry import OPS, OpDef, get  # noqa: F401

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
