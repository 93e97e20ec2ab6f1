"""ONNX Runtime sessions that tests make themselves, as the peer: the file
run by ONNX Runtime alone, to hold blockc's numbers against.

A peer session takes ONNX Runtime's own default options but one: its
intra-op threads, which follow blockc's rule (``runtime/threads.py``:
``$BLOCKC_THREADS``, one per xdist worker under ``tests/conftest.py``), so
that a peer's pool does not spin on every core beside blockc's."""
from __future__ import annotations

import onnxruntime as ort

from blockc.runtime.threads import intra_op_threads


def peer_session(model) -> ort.InferenceSession:
    """A CPU ``InferenceSession`` of ``model`` (a path or serialized bytes)
    with ONNX Runtime's default options, its threads as above and its log
    at errors only (its warnings, unused initializers, are noise here)."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    threads = intra_op_threads()
    if threads is not None:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
