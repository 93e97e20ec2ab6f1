"""simplify_reshapes: golden IR text for each rule, and what it must leave alone."""
from blockc.passes.manager import label_origins
from blockc import parse_graph
from blockc.passes.simplify_reshapes import simplify_reshapes
from pass_testing import check_golden, fused, ir, run_pass


def test_docstring_example():
    check_golden(simplify_reshapes, """
        graph g(%k: f32[batch,seq,4,16]) {
          %0:f32[batch,4,seq,16] = transpose %k {perm=[0,2,1,3]}
          %1:f32[batch,4,16,seq] = transpose %0 {perm=[0,1,3,2]}
          return y=%1
        }
    """, """
        graph g(%k: f32[batch,seq,4,16]) {
          %0:f32[batch,4,16,seq] = transpose %k {perm=[0,2,3,1]}
          return y=%0
        }
    """)


def test_golden_every_rule():
    # a: transpose∘transpose composes; b: reshape∘reshape back to the input
    # shape disappears, and a reshape∘reshape to a new shape becomes one
    # reshape (0 where a dim is copied); c: an identity transpose and an
    # identity reshape vanish, and a transpose pair that cancels vanishes.
    check_golden(simplify_reshapes, """
        graph g(%x: f64[batch,seq,64], %k: f64[batch,seq,4,16]) {
          %0:f64[batch,4,seq,16] = transpose %k {perm=[0,2,1,3]}
          %1:f64[batch,4,16,seq] = transpose %0 {perm=[0,1,3,2]}
          %2:f64[batch,seq,4,16] = reshape %x {shape=[0,0,4,16]}
          %3:f64[batch,seq,64] = reshape %2 {shape=[0,0,64]}
          %4:f64[batch,seq,64] = tanh %3
          %5:f64[batch,seq,4,16] = reshape %4 {shape=[0,0,4,-1]}
          %6:f64[batch,seq,2,32] = reshape %5 {shape=[0,0,2,32]}
          %7:f64[batch,seq,4,16] = transpose %k {perm=[0,1,2,3]}
          %8:f64[batch,seq,4,16] = reshape %7 {shape=[0,0,0,0]}
          %9:f64[batch,4,seq,16] = transpose %8 {perm=[0,2,1,3]}
          %10:f64[batch,seq,4,16] = transpose %9 {perm=[0,2,1,3]}
          return a=%1, b=%6, c=%10
        }
    """, """
        graph g(%x: f64[batch,seq,64], %k: f64[batch,seq,4,16]) {
          %0:f64[batch,4,16,seq] = transpose %k {perm=[0,2,3,1]}
          %1:f64[batch,seq,64] = tanh %x
          %2:f64[batch,seq,2,32] = reshape %1 {shape=[0,0,2,32]}
          return a=%0, b=%2, c=%k
        }
    """)


def test_three_transposes_become_one():
    check_golden(simplify_reshapes, """
        graph g(%x: f64[2,3,4]) {
          %0:f64[3,2,4] = transpose %x {perm=[1,0,2]}
          %1:f64[3,4,2] = transpose %0 {perm=[0,2,1]}
          %2:f64[4,2,3] = transpose %1 {perm=[1,2,0]}
          return y=%2
        }
    """, """
        graph g(%x: f64[2,3,4]) {
          %0:f64[4,2,3] = transpose %x {perm=[2,0,1]}
          return y=%0
        }
    """)


def test_an_inner_transpose_used_elsewhere_is_kept():
    g = label_origins(parse_graph(ir("""
        graph g(%x: f64[2,3,4]) {
          %0:f64[3,2,4] = transpose %x {perm=[1,0,2]}
          %1:f64[4,2,3] = transpose %0 {perm=[2,1,0]}
          %2:f64[3,2,4] = tanh %0
          return y=%1, z=%2
        }
    """)))
    r = run_pass(simplify_reshapes, g)
    assert not r.changed
    assert str(r.graph) == str(g)
    (site,) = [s for s in r.sites if s.anchor == "%1" and s.rule == "transpose∘transpose"]
    assert not site.fused
    assert site.reason == "the transpose result (%0) is used elsewhere and the fused op does not return it"
    assert not fused(r.sites)


def test_rejection_reasons():
    r = run_pass(simplify_reshapes, """
        graph g(%x: f64[2,12]) {
          %0:f64[2,3,4] = reshape %x {shape=[2,3,4]}
          %1:f64[2,4,3] = transpose %0 {perm=[0,2,1]}
          return y=%1
        }
    """)
    reasons = {(s.rule, s.reason) for s in r.sites}
    assert ("identity reshape", "the reshape changes the shape") in reasons
    assert ("identity transpose", "not an identity permutation") in reasons
    assert ("transpose∘transpose", "expected transpose, found a reshape result") in reasons


def test_golden_transpose_through_merged_axes():
    # a: the docstring's k.transpose(-2, -1) through [4*batch, seq, 16] (torch's
    # SDPA through the dynamo exporter); b: the same on a repeat_kv expand
    # [batch,2,2,seq,16], split back as [batch,4]: x is reshaped first.
    check_golden(simplify_reshapes, """
        graph g(%k: f64[batch,4,seq,16], %r: f64[batch,2,2,seq,16]) {
          %0:f64[4*batch,seq,16] = reshape %k {shape=[-1,seq,16]}
          %1:f64[4*batch,16,seq] = transpose %0 {perm=[0,2,1]}
          %2:f64[batch,4,16,seq] = reshape %1 {shape=[batch,4,16,seq]}
          %3:f64[4*batch,seq,16] = reshape %r {shape=[4*batch,seq,16]}
          %4:f64[4*batch,16,seq] = transpose %3 {perm=[0,2,1]}
          %5:f64[batch,4,16,seq] = reshape %4 {shape=[batch,4,16,seq]}
          return a=%2, b=%5
        }
    """, """
        graph g(%k: f64[batch,4,seq,16], %r: f64[batch,2,2,seq,16]) {
          %0:f64[batch,4,16,seq] = transpose %k {perm=[0,1,3,2]}
          %1:f64[batch,4,seq,16] = reshape %r {shape=[0,4,seq,16]}
          %2:f64[batch,4,16,seq] = transpose %1 {perm=[0,1,3,2]}
          return a=%0, b=%2
        }
    """)


def test_a_transpose_across_the_merged_axes_stays():
    # %2: the transpose moves the merged axis; %4: the last reshape is not the merge undone.
    g = label_origins(parse_graph(ir("""
        graph g(%k: f64[2,4,5,6]) {
          %0:f64[8,5,6] = reshape %k {shape=[8,5,6]}
          %1:f64[5,8,6] = transpose %0 {perm=[1,0,2]}
          %2:f64[5,2,4,6] = reshape %1 {shape=[5,2,4,6]}
          %3:f64[8,6,5] = transpose %0 {perm=[0,2,1]}
          %4:f64[2,4,30] = reshape %3 {shape=[2,4,30]}
          return c=%2, d=%4
        }
    """)))
    r = run_pass(simplify_reshapes, g)
    assert not r.changed
    reasons = {s.anchor: s.reason for s in r.sites if s.rule == "transpose through merged axes"}
    assert {a: reasons[a] for a in ("%2", "%4")} == {"%2": "the transpose moves the merged axis",
                       "%4": "the reshape of [8,6,5] to [2,4,30] does not split its leading axis"}
