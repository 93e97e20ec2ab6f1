"""fuse_qkv: golden IR text with and without biases, and SwiGLU's gate/up
pair; mixed groups and projections whose intermediate is used elsewhere are
rejected with a reason."""
from blockc import parse_graph
from blockc.passes.fuse_qkv import fuse_qkv
from blockc.passes.manager import label_origins
from pass_testing import assert_same_numbers, check_golden, fused, ir, run_pass


def test_golden_with_biases():
    # Different widths; a bias added on either side; a user of Q that comes
    # before the last projection (the fused nodes go before the last one, then
    # the graph is sorted).
    r = check_golden(fuse_qkv, """
        graph g(%x: f64[batch,seq,8]) {
          param @wq: f64[8,8]
          param @bq: f64[8]
          param @wk: f64[8,4]
          param @bk: f64[4]
          param @wv: f64[8,4]
          param @bv: f64[4]
          %0:f64[batch,seq,8] = matmul %x, @wq
          %1:f64[batch,seq,8] = add %0, @bq
          %2:f64[batch,seq,8] = tanh %1
          %3:f64[batch,seq,4] = matmul %x, @wk
          %4:f64[batch,seq,4] = add @bk, %3
          %5:f64[batch,seq,4] = matmul %x, @wv
          %6:f64[batch,seq,4] = add %5, @bv
          return q=%2, k=%4, v=%6
        }
    """, """
        graph g(%x: f64[batch,seq,8]) {
          param @wq: f64[8,8]
          param @bq: f64[8]
          param @wk: f64[8,4]
          param @bk: f64[4]
          param @wv: f64[8,4]
          param @bv: f64[4]
          %0:f64[8,16] = concat @wq, @wk, @wv {axis=1}
          %1:f64[batch,seq,16] = matmul %x, %0
          %2:f64[16] = concat @bq, @bk, @bv {axis=0}
          %3:f64[batch,seq,16] = add %1, %2
          %4:f64[batch,seq,8], %5:f64[batch,seq,4], %6:f64[batch,seq,4] = split %3 {axis=-1, sizes=[8,4,4]}
          %7:f64[batch,seq,8] = tanh %4
          return q=%7, k=%5, v=%6
        }
    """)
    (site,) = r.sites
    assert site.fused and site.kind == "qkv"
    assert site.ops == ["matmul", "add", "matmul", "add", "matmul", "add"]
    assert site.result == "concat+matmul+add+split"


def test_golden_without_biases():
    r = check_golden(fuse_qkv, """
        graph g(%x: f64[3,8]) {
          param @wq: f64[8,8]
          param @wk: f64[8,8]
          param @wv: f64[8,8]
          %0:f64[3,8] = matmul %x, @wq
          %1:f64[3,8] = matmul %x, @wk
          %2:f64[3,8] = matmul %x, @wv
          %3:f64[3,8] = mul %0, %1
          %4:f64[3,8] = add %3, %2
          return y=%4
        }
    """, """
        graph g(%x: f64[3,8]) {
          param @wq: f64[8,8]
          param @wk: f64[8,8]
          param @wv: f64[8,8]
          %0:f64[8,24] = concat @wq, @wk, @wv {axis=1}
          %1:f64[3,24] = matmul %x, %0
          %2:f64[3,8], %3:f64[3,8], %4:f64[3,8] = split %1 {axis=-1, sizes=[8,8,8]}
          %5:f64[3,8] = mul %2, %3
          %6:f64[3,8] = add %5, %4
          return y=%6
        }
    """)
    assert [s.result for s in fused(r.sites)] == ["concat+matmul+split"]


def test_two_groups_fuse_separately_and_a_lone_projection_is_no_site():
    g = parse_graph(ir("""
        graph g(%x: f64[3,8], %y: f64[3,8]) {
          param @w1: f64[8,8]
          param @w2: f64[8,8]
          param @w3: f64[8,4]
          %0:f64[3,8] = matmul %x, @w1
          %1:f64[3,8] = matmul %x, @w2
          %2:f64[3,8] = matmul %y, @w1
          %3:f64[3,8] = matmul %y, @w2
          %4:f64[3,4] = matmul %0, @w3
          return a=%1, b=%2, c=%3, d=%4
        }
    """))
    r = run_pass(fuse_qkv, g)
    assert [s.fused for s in r.sites] == [True, True]
    assert r.graph.op_counts() == {"concat": 2, "matmul": 3, "split": 2}
    assert_same_numbers(g, r.graph)


def _rejected(text):
    g = label_origins(parse_graph(ir(text)))
    r = run_pass(fuse_qkv, g)
    assert not r.changed
    assert str(r.graph) == str(g)
    (site,) = r.sites
    assert not site.fused and site.kind == "qkv" and site.anchor == "%0"
    return site.reason


def test_mixed_biases_are_rejected():
    assert _rejected("""
        graph g(%x: f64[3,8]) {
          param @wq: f64[8,8]
          param @bq: f64[8]
          param @wk: f64[8,8]
          %0:f64[3,8] = matmul %x, @wq
          %1:f64[3,8] = add %0, @bq
          %2:f64[3,8] = matmul %x, @wk
          return q=%1, k=%2
        }
    """) == "some projections have a bias and some do not"


def test_a_projection_whose_product_is_also_returned_is_not_merged_with_its_bias():
    # x @ Wq is both biased and a graph output: merging the add would drop it.
    assert _rejected("""
        graph g(%x: f64[3,8]) {
          param @wq: f64[8,8]
          param @bq: f64[8]
          param @wk: f64[8,8]
          param @bk: f64[8]
          %0:f64[3,8] = matmul %x, @wq
          %1:f64[3,8] = add %0, @bq
          %2:f64[3,8] = matmul %x, @wk
          %3:f64[3,8] = add %2, @bk
          return q=%1, k=%3, raw=%0
        }
    """) == "some projections have a bias and some do not"


def test_a_product_also_read_by_another_node_keeps_its_add():
    assert _rejected("""
        graph g(%x: f64[3,8]) {
          param @wq: f64[8,8]
          param @bq: f64[8]
          param @wk: f64[8,8]
          param @bk: f64[8]
          %0:f64[3,8] = matmul %x, @wq
          %1:f64[3,8] = add %0, @bq
          %2:f64[3,8] = tanh %0
          %3:f64[3,8] = matmul %x, @wk
          %4:f64[3,8] = add %3, @bk
          return q=%1, k=%4, t=%2
        }
    """) == "some projections have a bias and some do not"


def test_a_non_parameter_bias_stays_an_add():
    # the "bias" is an input: both projections count as bias-free and merge;
    # the add stays, reading its part of the split.
    check_golden(fuse_qkv, """
        graph g(%x: f64[3,8], %b: f64[8]) {
          param @wq: f64[8,8]
          param @wk: f64[8,8]
          %0:f64[3,8] = matmul %x, @wq
          %1:f64[3,8] = add %0, %b
          %2:f64[3,8] = matmul %x, @wk
          return q=%1, k=%2
        }
    """, """
        graph g(%x: f64[3,8], %b: f64[8]) {
          param @wq: f64[8,8]
          param @wk: f64[8,8]
          %0:f64[8,16] = concat @wq, @wk {axis=1}
          %1:f64[3,16] = matmul %x, %0
          %2:f64[3,8], %3:f64[3,8] = split %1 {axis=-1, sizes=[8,8]}
          %4:f64[3,8] = add %2, %b
          return q=%4, k=%3
        }
    """)


def test_golden_swiglu_gate_and_up():
    # down(silu(x @ gate) * (x @ up)): the gate and up projections are siblings too
    r = check_golden(fuse_qkv, """
        graph g(%x: f64[batch,seq,8]) {
          param @gate: f64[8,12]
          param @up: f64[8,12]
          param @down: f64[12,8]
          %0:f64[batch,seq,12] = matmul %x, @gate
          %1:f64[batch,seq,12] = silu %0
          %2:f64[batch,seq,12] = matmul %x, @up
          %3:f64[batch,seq,12] = mul %1, %2
          %4:f64[batch,seq,8] = matmul %3, @down
          return y=%4
        }
    """, """
        graph g(%x: f64[batch,seq,8]) {
          param @gate: f64[8,12]
          param @up: f64[8,12]
          param @down: f64[12,8]
          %0:f64[8,24] = concat @gate, @up {axis=1}
          %1:f64[batch,seq,24] = matmul %x, %0
          %2:f64[batch,seq,12], %3:f64[batch,seq,12] = split %1 {axis=-1, sizes=[12,12]}
          %4:f64[batch,seq,12] = silu %2
          %5:f64[batch,seq,12] = mul %4, %3
          %6:f64[batch,seq,8] = matmul %5, @down
          return y=%6
        }
    """)
    assert [(s.result, s.ops) for s in fused(r.sites)] == [("concat+matmul+split", ["matmul", "matmul"])]
