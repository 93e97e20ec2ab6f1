"""blockc's version: at the bottom of the package, where every layer may read it."""
__version__ = "0.1.0"
