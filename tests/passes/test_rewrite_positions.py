"""The rewrite engine keeps node positions up to date instead of rescanning
the graph per rewrite: its answers must be those a full scan gives, also
after a rewrite has left the node list out of topological order, and a pass
must read the node list a fixed number of times, however deep the model."""
import pytest

import blockc
from blockc.ir.graph import Graph
from blockc.passes.fuse_add_layernorm import fuse_add_layernorm
from blockc.passes.fuse_qkv import fuse_qkv
from blockc.passes.manager import label_origins
from blockc.passes.simplify_reshapes import simplify_reshapes
from pass_testing import check_golden


def test_a_cycle_is_still_seen_after_a_rewrite_left_the_list_out_of_order():
    # The first fusion (%4) returns the sum %2 to the reduce_mean %3, which
    # stands before the fused op: the list is out of order until the pass
    # sorts it. The second site (%5) reads gamma = %3, computed from its own
    # sum %0 through the first fused op: fusing it would make a cycle, which
    # only a correct topological ranking reveals.
    r = check_golden(fuse_add_layernorm, """
        graph g(%x: f64[2,3,4], %r: f64[2,3,4]) {
          param @g: f64[4]
          param @b: f64[4]
          %0:f64[2,3,4] = add %x, %r
          %1:f64[2,3,4] = tanh %0
          %2:f64[2,3,4] = add %1, %r
          %3:f64[4] = reduce_mean %2 {axes=[0,1], keepdims=false}
          %4:f64[2,3,4] = layernorm %2, @g, @b {eps=1e-05}
          %5:f64[2,3,4] = layernorm %0, %3, @b {eps=1e-05}
          %6:f64[2,3,4] = add %4, %5
          return y=%6
        }
    """, """
        graph g(%x: f64[2,3,4], %r: f64[2,3,4]) {
          param @g: f64[4]
          param @b: f64[4]
          %0:f64[2,3,4] = add %x, %r
          %1:f64[2,3,4] = tanh %0
          %2:f64[2,3,4], %3:f64[2,3,4] = add_layernorm %1, %r, @g, @b {eps=1e-05, with_sum=true}
          %4:f64[4] = reduce_mean %3 {axes=[0,1], keepdims=false}
          %5:f64[2,3,4] = layernorm %0, %4, @b {eps=1e-05}
          %6:f64[2,3,4] = add %2, %5
          return y=%6
        }
    """)
    first, second = r.sites
    assert first.fused
    assert not second.fused and second.reason.endswith("(a cycle)")


@pytest.mark.parametrize("pass_fn", [fuse_add_layernorm, fuse_qkv, simplify_reshapes])
def test_a_pass_reads_the_node_list_a_fixed_number_of_times(pass_fn, monkeypatch):
    reads = []
    nodes = Graph.nodes

    def counting(self):
        reads.append(1)
        return nodes.fget(self)

    def count(layers):
        g = label_origins(blockc.trace(blockc.build_model("gpt2", {"layers": str(layers)})))
        reads.clear()
        monkeypatch.setattr(Graph, "nodes", property(counting, nodes.fset))
        try:
            changed = pass_fn(g).changed
        finally:
            monkeypatch.setattr(Graph, "nodes", nodes)
        assert changed
        return len(reads)

    assert count(2) == count(8)
