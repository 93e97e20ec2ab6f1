"""ONNX Runtime GenAI's model builder, run the one way the tests and the bench share.

GenAI's builder imports transformers 5, while the environment that holds
``onnxruntime-genai`` (named by ``BLOCKC_GENAI_PYTHON``) may pin an older one
for Optimum. So the builder runs in *this* Python, with only the
``onnxruntime_genai`` package of that environment on its path; GenAI's
``og.Generator`` still runs in that environment, with its own onnxruntime."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile


def build_genai(genai_python: str, hf: str, out: str, cache: str, timeout: float = 600) -> None:
    """GenAI's fp32 CPU model of the Hugging Face directory ``hf``, into ``out``."""
    where = subprocess.run([genai_python, "-c", "import onnxruntime_genai, os; "
                            "print(os.path.dirname(os.path.dirname(onnxruntime_genai.__file__)))"],
                           check=True, capture_output=True, text=True, timeout=timeout).stdout.strip()
    path = tempfile.mkdtemp(prefix="genai-pkg-")
    os.symlink(os.path.join(where, "onnxruntime_genai"), os.path.join(path, "onnxruntime_genai"))
    done = subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", str(hf), "-i", str(hf),
                           "-o", str(out), "-p", "fp32", "-e", "cpu", "-c", str(cache)],
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": path})
    if done.returncode != 0:
        raise RuntimeError(f"GenAI's model builder failed on {hf}:\n{done.stderr[-3000:]}")
