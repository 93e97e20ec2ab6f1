"""Lets the pass tests import their shared helpers (``pass_testing``).

pytest runs with ``--import-mode=importlib``, which puts no test folder on
``sys.path``; this conftest is loaded before the test modules, so adding its
own folder here is enough.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
