"""Lets the generation tests import the Hugging Face helpers the front-end
tests share (``tests/frontends/hf_testing.py``), and each other's helpers
(``test_loop``'s weights and recomputation, which ``test_inplace`` reuses),
and makes the random Hugging Face directories the text tests share."""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(_HERE), "frontends"))
sys.path.insert(0, _HERE)

from hf_dirs import hf_dir  # noqa: E402,F401  (the shared fixture)
