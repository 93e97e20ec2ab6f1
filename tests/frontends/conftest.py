"""Lets the front-end tests import their shared helpers (``hf_testing``); see
tests/passes/conftest.py for why a conftest is the place."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
