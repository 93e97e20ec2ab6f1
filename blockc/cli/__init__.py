"""The ``blockc`` command line: one module per command (``models``, ``show``,
``fusions``, ``check``, ``summary``, ``export``, ``cuda``, ``run``,
``generate``, ``compare``, ``cache``), the options several commands share
declared once in ``options``, what they do with them in ``common``, and the
parser and ``main`` in ``app``, which lists the commands."""
from .app import COMMANDS, build_parser, main

__all__ = ["COMMANDS", "build_parser", "main"]
