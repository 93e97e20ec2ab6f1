"""The decode step compiled in a second thread while the prefill is compiled
and runs (``generate/background.py``): concurrently where the backend says
it may (``Backend.compiles_concurrently``), with the same tokens, the same
errors, and the step's compile always closed and its thread always ended."""
import threading

import pytest

from blockc.errors import BlockcError
from blockc.frontends import build_model
from blockc.generate import generate
from blockc.runtime.backend import register, unregister
from blockc.runtime.backends.ort import OrtBackend
from blockc.runtime.backends.reference import ReferenceBackend, ReferenceCompiled
from blockc.runtime.interface import CompileHints

from test_loop import PROMPTS, weights_of  # noqa: E402

WAIT_S = 20   # what a test waits for the other thread at most: a sequential compile fails in this time, never hangs


class Gated(ReferenceBackend):
    """The reference interpreter, compiled concurrently, with a hook on each
    compile and on the prefill's run (a test's ``on_prefill_compile``,
    ``on_decode_compile``, ``on_prefill_run``); what it made and closed."""

    compiles_concurrently = True
    hooks: dict = {}
    made: list = []
    closed: list = []

    def compile(self, graph, weights, *, variant=None, threads=None, count_kernels=False, hints=CompileHints()):
        prefill = hints.runs == 1
        self.hooks.get("on_prefill_compile" if prefill else "on_decode_compile", lambda: None)()
        compiled = HookedRun(graph, weights, float64=False, run_hook=self.hooks.get("on_prefill_run")
                             if prefill else None)
        self.made.append((compiled, threading.current_thread()))
        return compiled


class HookedRun(ReferenceCompiled):
    def __init__(self, graph, weights, *, float64, run_hook):
        super().__init__(graph, weights, float64=float64)
        self.run_hook = run_hook

    def unchecked_runner(self, feeds, bindings):
        run = super().unchecked_runner(feeds, bindings)

        def hooked():
            if self.run_hook is not None:
                self.run_hook()
            return run()
        return hooked

    def close(self):
        Gated.closed.append(self)
        super().close()


@pytest.fixture
def gated():
    Gated.hooks, Gated.made, Gated.closed = {}, [], []
    register("gated", Gated)
    yield Gated
    unregister("gated")
    assert not [t for t in threading.enumerate() if t.name == "blockc-compile-ahead"], "a compile thread was left"


@pytest.fixture(scope="module")
def tiny():
    model = build_model("tiny", {"layers": "1"})
    return model, weights_of(model)


def test_the_decode_step_compiles_while_the_prefill_runs(gated, tiny):
    """The decode step's compile waits until the prefill has run, and the
    prefill's run until that compile has begun: compiled one after the
    other, this fails after ``WAIT_S`` (it cannot hang)."""
    began, ran = threading.Event(), threading.Event()

    def decode_compile():
        began.set()
        if not ran.wait(WAIT_S):
            raise AssertionError("the prefill did not run while the decode step compiled")

    def prefill_run():
        ran.set()
        if not began.wait(WAIT_S):
            raise AssertionError("the decode step's compile had not begun when the prefill ran")
    gated.hooks.update(on_decode_compile=decode_compile, on_prefill_run=prefill_run)
    model, weights = tiny
    got = generate(model, weights, PROMPTS, 4, backend="gated")
    assert got.tokens == generate(model, weights, PROMPTS, 4, backend="reference").tokens
    threads = [t for _, t in gated.made]
    assert len(threads) == 2 and threads.count(threading.main_thread()) == 1   # the prefill's, and the step's apart
    assert sorted(map(id, gated.closed)) == sorted(id(c) for c, _ in gated.made)
    # the first step waited for the rest of the compile: reported, and counted in that step
    assert 0 < got.decode_wait_s <= got.step_s[0] and got.as_json()["decode_wait_s"] == got.decode_wait_s


class DecodeRefused(Exception):
    pass


@pytest.mark.parametrize("error", [BlockcError("the decode step cannot be compiled: no room"),
                                   DecodeRefused("an error of the backend's own")])
def test_an_error_of_the_decode_compile_reaches_the_caller_as_it_was(gated, tiny, error):
    def decode_compile():
        raise error
    gated.hooks.update(on_decode_compile=decode_compile)
    with pytest.raises(type(error)) as raised:
        generate(*tiny, PROMPTS, 3, backend="gated")
    assert raised.value is error and str(raised.value) == str(error)
    assert [t for _, t in gated.made] == [threading.main_thread()] and len(gated.closed) == 1   # the prefill's


@pytest.mark.parametrize("where", ["on_prefill_compile", "on_prefill_run"])
@pytest.mark.parametrize("error", [BlockcError("the prefill failed"), KeyboardInterrupt()])
def test_the_decode_step_is_closed_when_the_prefill_raises(gated, tiny, where, error):
    """Its compile, still running when the prefill raises (it waits for
    that), is waited for and what it made is closed; the prefill's error
    is the one raised, and no thread is left (``gated``)."""
    raised = threading.Event()

    def decode_compile():
        if not raised.wait(WAIT_S):
            raise AssertionError("the decode step compiled after the prefill, not beside it")

    def prefill_fails():
        raised.set()
        raise error
    gated.hooks.update({"on_decode_compile": decode_compile, where: prefill_fails})
    with pytest.raises(type(error)) as got:
        generate(*tiny, PROMPTS, 3, backend="gated")
    assert got.value is error
    decode = [c for c, t in gated.made if t is not threading.main_thread()]
    assert len(decode) == 1 and decode[0] in gated.closed


class SequentialOrt(OrtBackend):
    compiles_concurrently = False   # the decode step compiled before the prefill, in one thread, as before


@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("form", ["fused", "standard"])
def test_ort_generates_the_same_tokens_with_the_decode_compiled_concurrently(rows, form):
    model = build_model("llama-tiny", {"layers": "1"})
    weights = weights_of(model)
    prompts = [[5, 17, 99, 3], [200, 1, 64, 9], [7, 7, 2, 11], [30, 31, 32, 33]][:rows]   # one length: one graph
    register("ort-sequential", SequentialOrt)
    try:
        before = generate(model, weights, prompts, 5, backend="ort-sequential", form=form)
    finally:
        unregister("ort-sequential")
    after = generate(model, weights, prompts, 5, backend="ort-cpu", form=form)
    assert after.tokens == before.tokens
    assert before.decode_wait_s == 0   # compiled before the prefill: nothing left to wait for after it


class InOrder(Gated):
    compiles_concurrently = False


def test_a_backend_that_cannot_compile_beside_compiles_in_order_in_one_thread(gated, tiny):
    """The prefill, then the decode step, both before the prefill runs, as
    always; a failed prefill compile leaves the step never compiled."""
    order = []
    gated.hooks.update(on_prefill_compile=lambda: order.append("prefill"),
                       on_decode_compile=lambda: order.append("decode"),
                       on_prefill_run=lambda: order.append("run"))
    register("in-order", InOrder)
    try:
        got = generate(*tiny, PROMPTS, 3, backend="in-order")
        assert order == ["prefill", "decode", "run"] and got.decode_wait_s == 0
        assert {t for _, t in gated.made} == {threading.main_thread()} and len(gated.closed) == 2

        def refuse():
            raise BlockcError("no prefill here")
        gated.hooks.update(on_prefill_compile=refuse)
        order.clear()
        with pytest.raises(BlockcError, match="no prefill here"):
            generate(*tiny, PROMPTS, 3, backend="in-order")
        assert order == []
    finally:
        unregister("in-order")
