"""The kernel families: importing this package imports every module in it,
and so registers every family (``codegen/cuda/family.py``). A new family is
one new file here; nothing else lists the modules."""
import importlib
import pkgutil

from ..family import FAMILIES, KernelFamily, KernelStep, family_of, lowers  # noqa: F401

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
