"""The command-line tests share the random Hugging Face directories
(``tests/frontends/hf_dirs.py``'s ``hf_dir`` fixture) and the generation
tests' Hugging Face reference (``tests/generate/test_text_generate.hf_text``)."""
import os
import sys

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_TESTS, "frontends"))
sys.path.insert(0, os.path.join(_TESTS, "generate"))

from hf_dirs import hf_dir  # noqa: E402,F401  (the shared fixture)
