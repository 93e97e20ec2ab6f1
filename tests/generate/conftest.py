"""Lets the generation tests import the Hugging Face helpers the front-end
tests share (``tests/frontends/hf_testing.py``)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "frontends"))
