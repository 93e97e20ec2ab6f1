"""What a ``blockc generate`` or ``run`` process imports: not what it never
uses. Each import is start-up time the user waits for (the bench's whole
run, from process start, counts it), so one made lazy must stay lazy."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Packages a run of a built-in model or a Hugging Face directory never uses: the ONNX frontend (an .onnx
# model's alone), torch (the torch backends'), rich and jinja2 (not on this path)
NEVER = ("blockc.frontends.onnx", "torch", "rich", "jinja2", "transformers", "matplotlib")

_RUN = """import runpy, sys
sys.argv = ["blockc", *sys.argv[1:]]
try:
    runpy.run_module("blockc.cli", run_name="__main__")
except SystemExit as done:
    assert not done.code, done.code
print("MODULES", *sorted(sys.modules))
"""


def imported(cache, *argv) -> set[str]:
    """The modules a ``blockc`` process with these arguments has imported by its end."""
    env = {**os.environ, "BLOCKC_CACHE": str(cache)}
    done = subprocess.run([sys.executable, "-c", _RUN, *argv], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.rsplit("MODULES", 1)[1].split())


def unused(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in NEVER))


@pytest.mark.parametrize("argv", [("generate", "llama-tiny", "--set", "layers=1", "--prompt-ids", "1,2,3",
                                   "--max-new", "2"),
                                  ("run", "tiny", "--set", "layers=1", "--dim", "seq=4")])
def test_a_run_imports_nothing_it_does_not_use(tmp_path, argv):
    """Cold (the cache empty: traced, optimized, exported) and warm (from the cache)."""
    cold = imported(tmp_path, *argv)
    warm = imported(tmp_path, *argv)
    assert (unused(cold), unused(warm)) == ([], [])
    assert "onnxruntime" in warm and "blockc.ops.registry" in warm   # it did run, on ONNX Runtime


def test_the_facade_still_gives_every_name():
    """``blockc``'s names are imported when first asked for (PEP 562), each
    the object its module defines, and the op registry is complete."""
    import blockc
    from blockc.ops.registry import OPS
    from blockc.passes.manager import optimize
    assert blockc.optimize is optimize
    assert set(blockc.__all__) <= set(dir(blockc))
    assert all(getattr(blockc, name) is not None for name in blockc.__all__)
    assert {"matmul", "gelu", "softmax"} <= set(OPS)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        blockc.nothing


def test_a_bare_import_still_gives_the_subpackages_it_gave():
    """Before the names were lazy, ``import blockc`` left ``blockc.passes.manager``,
    ``blockc.frontends.onnx`` and ``blockc.runtime.reference`` reachable: still so,
    in a fresh process (this one has imported them already)."""
    code = ("import sys, blockc; assert 'blockc.frontends.onnx' not in sys.modules; "
            "assert blockc.passes.manager.optimize is blockc.optimize; "
            "assert blockc.frontends.onnx.load_onnx is blockc.load_onnx; "
            "assert blockc.runtime.reference.run_reference is blockc.run_reference")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
