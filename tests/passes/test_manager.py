"""The pass manager: every pass is called as ``p(graph)`` and reports its
sites in its result; Python's cyclic garbage collector is paused while the
pipeline runs (see ``_collector_paused``) and always given back as it was."""
import gc

import pytest

import blockc
from blockc.errors import BlockcError
from blockc.ir.types import TensorType
from blockc.passes import manager
from blockc.passes.base import PassResult
from blockc.passes.pipeline import FUSIONS, RECOMPOSITIONS, default_pipeline


def test_every_pass_takes_the_graph_alone_and_returns_its_sites():
    g = manager.label_origins(blockc.trace(blockc.build_model("tiny")))
    fusion_sites = []
    for p in default_pipeline():
        r = p(g)
        assert isinstance(r, PassResult) and isinstance(r.sites, list), p.__name__
        if p.__name__ in FUSIONS + RECOMPOSITIONS:
            fusion_sites += r.sites
        g = r.graph
    assert any(s.fused for s in fusion_sites)


@pytest.fixture
def collector():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_off_during_the_passes_and_left_as_it_was(enabled, collector, monkeypatch):
    g = blockc.trace(blockc.build_model("tiny"))
    (gc.enable if enabled else gc.disable)()
    seen = []
    real = manager.verify
    monkeypatch.setattr(manager, "verify", lambda graph: (seen.append(gc.isenabled()), real(graph)))
    blockc.optimize(g)
    assert seen and not any(seen)
    assert gc.isenabled() == enabled

    monkeypatch.setattr(manager, "verify", lambda graph: (_ for _ in ()).throw(BlockcError("broken")))
    with pytest.raises(BlockcError, match="broken"):
        blockc.optimize(g)
    assert gc.isenabled() == enabled


def test_a_valid_result_is_verified_once(monkeypatch):
    """Verifying after every pass cost two thirds of the pipeline: outside
    the tests the result is checked, once."""
    monkeypatch.delenv(manager.VERIFY_EACH_PASS, raising=False)
    g = blockc.trace(blockc.build_model("tiny"))
    seen = []
    real = manager.verify
    monkeypatch.setattr(manager, "verify", lambda graph: (seen.append(graph), real(graph)))
    r = blockc.optimize(g)
    assert seen == [r.graph]


@pytest.mark.parametrize("each", ["1", ""], ids=["each pass", "the result"])
@pytest.mark.parametrize("then", ["nothing", "a pass that fails on it"])
def test_the_pass_that_breaks_the_graph_is_named(monkeypatch, then, each):
    """Outside the tests only a broken graph pays for the per-pass checks:
    the pipeline runs again verifying after each pass, and the error names
    the pass that broke it, also where a later pass fails on the broken
    graph first."""
    monkeypatch.setenv(manager.VERIFY_EACH_PASS, each)
    broken = set()
    real = manager.verify

    def verify(graph):
        if id(graph) in broken:
            raise BlockcError("a value without a producer")
        real(graph)

    def breaks_it(graph):
        out = graph.copy()
        broken.add(id(out))
        return PassResult(out, True)

    def fails_on_it(graph):
        if id(graph) in broken:
            raise KeyError("%7")
        return PassResult(graph, False)
    passes = [*default_pipeline(), breaks_it] + ([fails_on_it] if then != "nothing" else [])
    monkeypatch.setattr(manager, "default_pipeline", lambda: passes)
    monkeypatch.setattr(manager, "verify", verify)
    with pytest.raises(BlockcError, match="invalid after pass breaks_it: a value without a producer"):
        blockc.optimize(blockc.trace(blockc.build_model("tiny")))


def test_the_tests_verify_after_every_pass_so_a_break_a_later_pass_hides_is_caught(monkeypatch):
    """A pass leaves an unused, mistyped node that the last dead-code pass
    removes: the result verifies, so only the per-pass check, which the test
    suite turns on (tests/conftest.py), names the pass."""
    def leaves_junk(graph):
        g = graph.copy()
        x = g.inputs[0]
        n = g.add_node("neg", [x])
        n.outputs[0].type = TensorType(x.type.dtype, (7, 7, 7))
        return PassResult(g, True)
    passes = default_pipeline()
    passes.insert(len(passes) - 1, leaves_junk)
    assert passes[-1].__name__ == "dce"
    monkeypatch.setattr(manager, "default_pipeline", lambda: passes)
    g = blockc.trace(blockc.build_model("tiny"))
    assert manager.verifies_each_pass()
    with pytest.raises(BlockcError, match="invalid after pass leaves_junk"):
        blockc.optimize(g)
    monkeypatch.setenv(manager.VERIFY_EACH_PASS, "")
    blockc.verify(blockc.optimize(g).graph)   # what one check of the result cannot see
