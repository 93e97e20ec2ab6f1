"""Lets the generation tests import the Hugging Face helpers the front-end
tests share (``tests/frontends/hf_testing.py``), and each other's helpers
(``test_loop``'s weights and recomputation, which ``test_inplace`` reuses),
and makes the random Hugging Face directories the text tests share."""
import os
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(_HERE), "frontends"))
sys.path.insert(0, _HERE)


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory):
    """``hf_dir(family, tokenizer="bytelevel")``: a random Hugging Face
    directory of ``family`` (``hf_dirs.save_hf_dir``, seed 0), made once per session."""
    pytest.importorskip("transformers")
    from hf_dirs import save_hf_dir
    made = {}

    def make(family: str, tokenizer: str = "bytelevel"):
        if (family, tokenizer) not in made:
            made[family, tokenizer] = save_hf_dir(family, tmp_path_factory.mktemp(family) / family, seed=0,
                                                  tokenizer=tokenizer)
        return made[family, tokenizer]
    return make
