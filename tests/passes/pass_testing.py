"""Shared helpers for the pass tests: golden IR text, sites, and numbers
against the float64 reference interpreter."""
from __future__ import annotations

import textwrap

import numpy as np

from blockc import parse_graph, run_reference, verify
from blockc.ir.dims import evaluate
from blockc.ir.dtypes import DType
from blockc.ir.graph import Graph
from blockc.passes.base import PassResult

# Sizes for the symbolic dims the tests' IR text uses.
DIMS = {"batch": 2, "seq": 5, "past": 3, "b": 2, "h": 3, "s": 5}


def ir(text: str) -> str:
    """IR text written indented in a test, as the printer writes it."""
    return textwrap.dedent(text).strip("\n") + "\n"


def run_pass(fn, graph: Graph | str) -> PassResult:
    """``fn(graph)``, given a graph or its IR text; the result verifies and the input is left as it was."""
    if isinstance(graph, str):
        graph = parse_graph(ir(graph))
    before = str(graph)
    result = fn(graph)
    verify(result.graph)
    assert str(graph) == before, f"{fn.__name__} changed its input graph"
    return result


def check_golden(fn, before: str, after: str, *, numbers: bool = True,
                 dims: dict | None = None, rtol: float = 1e-9) -> PassResult:
    """Run ``fn`` on the IR ``before``; its output must print as ``after``,
    ``changed`` must say whether it did, and (when it changed) the numbers of
    both graphs must agree on random inputs."""
    before, after = ir(before), ir(after)
    g = parse_graph(before)
    assert str(g) == before, "the test's input text is not in printed form"
    result = run_pass(fn, g)
    assert str(result.graph) == after
    assert result.changed == (after != before)
    if result.changed and numbers:
        assert_same_numbers(g, result.graph, dims=dims, rtol=rtol)
    return result


def random_feeds(g: Graph, rng: np.random.Generator, dims: dict | None = None) -> dict:
    bindings = dict(DIMS, **(dims or {}))
    feeds = {}
    for v in g.inputs:
        shape = tuple(evaluate(d, bindings) for d in v.shape)
        if v.dtype == DType.bool:
            feeds[v.name] = rng.random(shape) < 0.7
        elif v.dtype.is_float:
            feeds[v.name] = rng.standard_normal(shape).astype(v.dtype.numpy)
        else:
            feeds[v.name] = rng.integers(0, 4, size=shape).astype(v.dtype.numpy)
    return feeds


def random_weights(g: Graph, rng: np.random.Generator) -> dict:
    return {name: rng.standard_normal(v.type.concrete_shape({})) for name, v in g.params.items()}


def assert_same_numbers(a: Graph, b: Graph, *, weights: dict | None = None, feeds: dict | None = None,
                        dims: dict | None = None, seed: int = 0, rtol: float = 1e-9, atol: float = 1e-11) -> None:
    """Both graphs give the same outputs (float64 reference) on random inputs."""
    rng = np.random.default_rng(seed)
    weights = random_weights(a, rng) if weights is None else weights
    feeds = random_feeds(a, rng, dims) if feeds is None else feeds
    want = run_reference(a, weights, feeds)
    got = run_reference(b, {k: w for k, w in weights.items() if k in b.params}, feeds)
    assert list(got) == list(want)
    for name in want:
        assert got[name].shape == want[name].shape, name
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol, err_msg=f"output {name}")


def fused(sites: list, kind: str | None = None) -> list:
    return [s for s in sites if s.fused and (kind is None or s.kind == kind)]


def rejected(sites: list, kind: str | None = None) -> list:
    return [s for s in sites if not s.fused and (kind is None or s.kind == kind)]


def nodes_of(g: Graph, op: str) -> list:
    return [n for n in g.nodes if n.op == op]
