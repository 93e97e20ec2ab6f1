"""Intra-op threads (``runtime/threads.py``): ``$BLOCKC_THREADS`` reaches the
sessions blockc makes, a count asked for wins over it, and a bad value is
refused before any session is made."""
from __future__ import annotations

import pytest

from blockc.cli import main
from blockc.errors import BlockcError
from blockc.runtime.ort_runner import session_options
from blockc.runtime.threads import THREADS_VARIABLE, intra_op_threads


def test_the_variable_reaches_onnx_runtime_session_options(monkeypatch):
    monkeypatch.setenv(THREADS_VARIABLE, "3")
    assert session_options().intra_op_num_threads == 3
    assert session_options(threads=2).intra_op_num_threads == 2   # a count asked for wins
    monkeypatch.delenv(THREADS_VARIABLE)
    assert session_options().intra_op_num_threads == 0   # ONNX Runtime's own default: every core


def test_the_variable_reaches_torch_sessions(monkeypatch):
    pytest.importorskip("torch")
    from blockc.frontends import build_model, init_weights, trace
    from blockc.frontends.weights import materialize
    from blockc.runtime.torch_runner import TorchSession
    model = build_model("tiny", {"layers": "1"})
    monkeypatch.setenv(THREADS_VARIABLE, "1")
    assert TorchSession(trace(model), materialize(init_weights(model))).threads == 1


@pytest.mark.parametrize("text", ["many", "0", "-1", "1.5", "2 threads"])
def test_a_bad_value_is_refused(monkeypatch, text):
    monkeypatch.setenv(THREADS_VARIABLE, text)
    with pytest.raises(BlockcError, match=rf"^BLOCKC_THREADS='{text}' is not a positive whole number of threads"):
        intra_op_threads()
    assert intra_op_threads(4) == 4   # a count asked for does not read the variable


def test_an_empty_value_is_unset(monkeypatch):
    monkeypatch.setenv(THREADS_VARIABLE, " ")
    assert intra_op_threads() is None


def test_the_command_line_refuses_a_bad_value_in_one_line(monkeypatch, capsys):
    monkeypatch.setenv(THREADS_VARIABLE, "many")
    code = main(["run", "tiny", "--set", "layers=1", "--backend", "ort-cpu"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("blockc: error: BLOCKC_THREADS='many' is not a positive whole number")
    assert len(err.strip().splitlines()) == 1, err


def test_explicit_threads_are_checked_as_before():
    for bad in (0, -2, True, 1.5):
        with pytest.raises(BlockcError, match="threads must be a positive integer"):
            intra_op_threads(bad)
