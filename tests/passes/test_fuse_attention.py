"""fuse_attention: golden IR text with masked_softmax already fused and with
the raw softmax/scale/mask; Kᵀ as a plain last-two-axes transpose, as one
merged with the head split, and as a value; sites that must not fuse."""
import numpy as np
import pytest

from blockc import init_weights, parse_graph, run_reference, trace
from blockc.frontends import BlockConfig, BlockModel
from blockc.passes.fuse_attention import fuse_attention
from blockc.passes.manager import label_origins, optimize
from pass_testing import assert_same_numbers, check_golden, fused, ir, nodes_of, run_pass


def test_golden_after_masked_softmax_with_merged_transpose():
    # Kᵀ = transpose(k, [0,2,3,1]) (the head split and the swap in one): the
    # fused op reads K = transpose(k, [0,2,1,3]).
    r = check_golden(fuse_attention, """
        graph g(%q: f64[2,3,5,4], %k: f64[2,5,3,4], %v: f64[2,3,5,4], %m: bool[2,1,1,5]) {
          %0:f64[2,3,4,5] = transpose %k {perm=[0,2,3,1]}
          %1:f64[2,3,5,5] = matmul %q, %0
          %2:f64[2,3,5,5] = masked_softmax %1, %m {scale=0.5, mask="bool", causal=true, fill=-1000000000.0}
          %3:f64[2,3,5,4] = matmul %2, %v
          return y=%3
        }
    """, """
        graph g(%q: f64[2,3,5,4], %k: f64[2,5,3,4], %v: f64[2,3,5,4], %m: bool[2,1,1,5]) {
          %0:f64[2,3,5,4] = transpose %k {perm=[0,2,1,3]}
          %1:f64[2,3,5,4] = attention %q, %0, %v, %m {scale=0.5, mask="bool", causal=true, fill=-1000000000.0, guarded=false}
          return y=%1
        }
    """)
    (site,) = fused(r.sites)
    assert site.kind == "attention" and site.ops == ["transpose", "matmul", "masked_softmax", "matmul"]
    assert site.result == "transpose+attention"


def test_golden_raw_softmax_with_plain_transpose():
    # masked-softmax fusion off: softmax(where(causal, qkᵀ / 2, fill)); Kᵀ =
    # transpose(k, [0,1,3,2]) so the fused op reads k itself.
    check_golden(fuse_attention, """
        graph g(%q: f64[2,3,5,4], %k: f64[2,3,5,4], %v: f64[2,3,5,4]) {
          %0:f64[2,3,4,5] = transpose %k {perm=[0,1,3,2]}
          %1:f64[2,3,5,5] = matmul %q, %0
          %2:f64[] = constant {value=dense<f64[]: [2.0]>}
          %3:f64[2,3,5,5] = div %1, %2
          %4:bool[5,5] = causal_mask {rows=5, cols=5}
          %5:f64[] = constant {value=dense<f64[]: [-1000000000.0]>}
          %6:f64[2,3,5,5] = where %4, %3, %5
          %7:f64[2,3,5,5] = softmax %6 {axis=-1}
          %8:f64[2,3,5,4] = matmul %7, %v
          return y=%8
        }
    """, """
        graph g(%q: f64[2,3,5,4], %k: f64[2,3,5,4], %v: f64[2,3,5,4]) {
          %0:f64[] = constant {value=dense<f64[]: [2.0]>}
          %1:bool[5,5] = causal_mask {rows=5, cols=5}
          %2:f64[] = constant {value=dense<f64[]: [-1000000000.0]>}
          %3:f64[2,3,5,4] = attention %q, %k, %v {scale=0.5, mask="none", causal=true, fill=-1000000000.0, guarded=false}
          return y=%3
        }
    """)


def test_golden_kt_given_as_a_value():
    # No transpose to undo: the fused op gets one.
    check_golden(fuse_attention, """
        graph g(%q: f64[2,5,4], %kt: f64[2,4,6], %v: f64[2,6,3], %m: f64[2,5,6]) {
          %0:f64[2,5,6] = matmul %q, %kt
          %1:f64[2,5,6] = add %0, %m
          %2:f64[2,5,6] = softmax %1 {axis=-1}
          %3:f64[2,5,3] = matmul %2, %v
          return y=%3
        }
    """, """
        graph g(%q: f64[2,5,4], %kt: f64[2,4,6], %v: f64[2,6,3], %m: f64[2,5,6]) {
          %0:f64[2,6,4] = transpose %kt {perm=[0,2,1]}
          %1:f64[2,5,3] = attention %q, %0, %v, %m {scale=1.0, mask="additive", causal=false, fill=-3.4028234663852886e+38, guarded=false}
          return y=%1
        }
    """)


def test_golden_scale_split_on_q_and_kt():
    # torch's SDPA through the dynamo exporter: √scale on q and on Kᵀ, no
    # scale on the scores; both join the fused op's scale (0.5 * 0.5).
    check_golden(fuse_attention, """
        graph g(%q: f64[2,3,5,4], %k: f64[2,3,5,4], %v: f64[2,3,5,4], %m: f64[2,1,5,5]) {
          %0:f64[2,3,4,5] = transpose %k {perm=[0,1,3,2]}
          %1:f64[] = constant {value=dense<f64[]: [0.5]>}
          %2:f64[2,3,5,4] = mul %q, %1
          %3:f64[2,3,4,5] = mul %0, %1
          %4:f64[2,3,5,5] = matmul %2, %3
          %5:f64[2,3,5,5] = add %4, %m
          %6:f64[2,3,5,5] = softmax %5 {axis=-1}
          %7:f64[2,3,5,4] = matmul %6, %v
          return y=%7
        }
    """, """
        graph g(%q: f64[2,3,5,4], %k: f64[2,3,5,4], %v: f64[2,3,5,4], %m: f64[2,1,5,5]) {
          %0:f64[] = constant {value=dense<f64[]: [0.5]>}
          %1:f64[2,3,5,4] = attention %q, %k, %v, %m {scale=0.25, mask="additive", causal=false, fill=-3.4028234663852886e+38, guarded=false}
          return y=%1
        }
    """)


def test_golden_scale_on_k_before_its_transpose():
    check_golden(fuse_attention, """
        graph g(%q: f64[2,5,4], %k: f64[2,5,4], %v: f64[2,5,4]) {
          %0:f64[] = constant {value=dense<f64[]: [0.5]>}
          %1:f64[2,5,4] = mul %0, %k
          %2:f64[2,4,5] = transpose %1 {perm=[0,2,1]}
          %3:f64[2,5,5] = matmul %q, %2
          %4:f64[2,5,5] = masked_softmax %3 {scale=0.25, mask="none", causal=true, fill=-1000000000.0}
          %5:f64[2,5,4] = matmul %4, %v
          return y=%5
        }
    """, """
        graph g(%q: f64[2,5,4], %k: f64[2,5,4], %v: f64[2,5,4]) {
          %0:f64[] = constant {value=dense<f64[]: [0.5]>}
          %1:f64[2,5,4] = attention %q, %k, %v {scale=0.125, mask="none", causal=true, fill=-1000000000.0, guarded=false}
          return y=%1
        }
    """)


def test_a_scale_that_broadcasts_q_stays():
    # A [1,1,1,1] factor on a 3-D q makes it 4-D: folding it in would change the shapes.
    g, r, sites = _sites("""
        graph g(%q: f64[2,5,4], %k: f64[1,2,5,4], %v: f64[1,2,5,4]) {
          %0:f64[1,1,1,1] = constant {value=dense<f64[1,1,1,1]: [0.5]>}
          %1:f64[1,2,5,4] = mul %q, %0
          %2:f64[1,2,4,5] = transpose %k {perm=[0,1,3,2]}
          %3:f64[1,2,5,5] = matmul %1, %2
          %4:f64[1,2,5,5] = softmax %3 {axis=-1}
          %5:f64[1,2,5,4] = matmul %4, %v
          return y=%5
        }
    """)
    # the scale stays on q, outside the fused op
    (node,) = nodes_of(r.graph, "attention")
    assert node.inputs[0].producer.op == "mul" and node.attrs["scale"] == 1.0
    assert_same_numbers(g, r.graph)


def _block(**cfg):
    model = BlockModel(BlockConfig(d_model=16, heads=2, dtype="float64", **cfg))
    return model, trace(model)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("masked_softmax", [True, False])
def test_in_a_traced_block_with_and_without_masked_softmax_fusion(causal, masked_softmax):
    model, g = _block(causal=causal)
    # fuse_qkv_attention off: it would take the attention op on (tests/passes/test_fuse_qkv_attention.py)
    disable = ["fuse_qkv_attention"] + ([] if masked_softmax else ["fuse_masked_softmax"])
    r = optimize(g, disable=disable)
    assert [s.kind for s in fused(r.sites, "attention")] == ["attention"]
    assert len(fused(r.sites, "masked_softmax")) == int(masked_softmax)
    (node,) = nodes_of(r.graph, "attention")
    assert node.attrs["causal"] is causal and node.attrs["mask"] == "none"
    assert node.attrs["scale"] == pytest.approx(8 ** -0.5, rel=1e-7)
    assert "softmax" not in r.graph.op_counts() and "masked_softmax" not in r.graph.op_counts()
    rng = np.random.default_rng(0)
    feeds = {s.name: s.sample({"batch": 2, "seq": 5}, rng) for s in model.inputs()}
    assert_same_numbers(g, r.graph, weights=dict(init_weights(model, seed=1)), feeds=feeds)


def _sites(text):
    g = label_origins(parse_graph(ir(text)))
    r = run_pass(fuse_attention, g)
    return g, r, r.sites


GUARDED = """
    graph g(%q: f64[2,5,4], %k: f64[2,5,4], %v: f64[2,5,4], %c: bool[2,1,5]) {
      %0:f64[2,4,5] = transpose %k {perm=[0,2,1]}
      %1:f64[2,5,5] = matmul %q, %0
      %2:f64[] = constant {value=dense<f64[]: [0.0]>}
      %3:f64[] = constant {value=dense<f64[]: [FILL]>}
      %4:f64[2,1,5] = where %c, %2, %3
      %5:f64[2,5,5] = add %1, %4
      %6:f64[2,5,5] = softmax %5 {axis=-1}
      %7:bool[2,5,5] = equal %6, %6
      %8:bool[2,5,5] = logical_not %7
      %9:f64[2,5,5] = where %8, %2, %6
      %10:f64[2,5,4] = matmul %9, %v
      return y=%10
    }
"""


def test_golden_nan_guard_after_softmax_with_a_finite_mask():
    # torch's SDPA: where(isnan(p), 0, p) after softmax; the padding mask is
    # where(c, 0, lowest), so no row is NaN and the guard goes.
    check_golden(fuse_attention, GUARDED.replace("FILL", "-1000000000.0"), """
        graph g(%q: f64[2,5,4], %k: f64[2,5,4], %v: f64[2,5,4], %c: bool[2,1,5]) {
          %0:f64[] = constant {value=dense<f64[]: [0.0]>}
          %1:f64[] = constant {value=dense<f64[]: [-1000000000.0]>}
          %2:f64[2,1,5] = where %c, %0, %1
          %3:f64[2,5,4] = attention %q, %k, %v, %2 {scale=1.0, mask="additive", causal=false, fill=-3.4028234663852886e+38, guarded=false}
          return y=%3
        }
    """)


def _with_a_row_masked_whole(g):
    rng = np.random.default_rng(0)
    feeds = {v.name: rng.standard_normal([int(d) for d in v.shape]) for v in g.inputs if v.name != "c"}
    return {**feeds, "c": np.array([[[True, False, True, True, False]], [[False] * 5]])}


# The fused op takes c as its boolean mask and is guarded: the rows with no key
# to see give zeros; written where(c, -inf, 0), the mask is not(c).
GUARD_AFTER = """
    graph g(%q: f64[2,5,4], %k: f64[2,5,4], %v: f64[2,5,4], %c: bool[2,1,5]) {
      %0:f64[] = constant {value=dense<f64[]: [0.0]>}
      %1:f64[] = constant {value=dense<f64[]: [-inf]>}
      %2:f64[2,1,5] = where %c, %0, %1
      %3:f64[2,5,4] = attention %q, %k, %v, %c {scale=1.0, mask="bool", causal=false, fill=-3.4028234663852886e+38, guarded=true}
      return y=%3
    }
"""
GUARD_AFTER_NOT = """
    graph g(%q: f64[2,5,4], %k: f64[2,5,4], %v: f64[2,5,4], %c: bool[2,1,5]) {
      %0:f64[] = constant {value=dense<f64[]: [0.0]>}
      %1:f64[] = constant {value=dense<f64[]: [-inf]>}
      %2:f64[2,1,5] = where %c, %1, %0
      %3:bool[2,1,5] = logical_not %c
      %4:f64[2,5,4] = attention %q, %k, %v, %3 {scale=1.0, mask="bool", causal=false, fill=-3.4028234663852886e+38, guarded=true}
      return y=%4
    }
"""


@pytest.mark.parametrize("allows", [True, False], ids=["where-c-0-inf", "where-c-inf-0"])
def test_golden_nan_guard_with_a_boolean_mask_written_as_minus_inf(allows):
    # torch's SDPA given HF's boolean mask as where(c, 0, -inf) (TorchScript's
    # and Optimum's exports): a fully masked row is NaN, the guard makes it 0.
    before = GUARDED.replace("FILL", "-inf")
    if not allows:
        before = before.replace("where %c, %2, %3", "where %c, %3, %2")
    r = check_golden(fuse_attention, before, GUARD_AFTER if allows else GUARD_AFTER_NOT, numbers=False)
    g = parse_graph(ir(before))
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((2, 5, 4)) for n in "qkv"}
    feeds["c"] = np.array([[[True, False, True, True, False]], [[False] * 5]]) == allows   # batch 1 masked whole
    assert_same_numbers(g, r.graph, feeds=feeds)
    assert not np.isnan(run_reference(g, {}, feeds)["y"]).any() and not run_reference(g, {}, feeds)["y"][1].any()


def test_nan_guard_stays_where_the_additive_mask_is_computed_at_run_time():
    g, r, sites = _sites(GUARDED.replace("FILL", "-inf").replace("where %c, %2, %3", "mul %m, %3").replace(
        "%c: bool[2,1,5]", "%c: bool[2,1,5], %m: f64[2,1,5]"))
    assert not r.changed
    (site,) = [s for s in sites if s.anchor == "%10"]
    assert site.reason == "the additive mask is computed at run time and may hold -inf: the NaN guard after " \
                          "softmax must stay"


def test_probabilities_used_elsewhere_block_the_fusion():
    g, r, sites = _sites("""
        graph g(%q: f64[5,4], %k: f64[5,4], %v: f64[5,4]) {
          %0:f64[4,5] = transpose %k {perm=[1,0]}
          %1:f64[5,5] = matmul %q, %0
          %2:f64[5,5] = masked_softmax %1 {scale=0.5, mask="none", causal=true, fill=-1000000000.0}
          %3:f64[5,4] = matmul %2, %v
          return y=%3, probs=%2
        }
    """)
    assert not r.changed and str(r.graph) == str(g)
    (site,) = [s for s in sites if s.anchor == "%3"]
    assert site.reason == "the masked_softmax result (%2) is used elsewhere and the fused op does not return it"


def test_scores_used_elsewhere_block_the_fusion():
    g, r, sites = _sites("""
        graph g(%q: f64[5,4], %k: f64[5,4], %v: f64[5,4]) {
          %0:f64[4,5] = transpose %k {perm=[1,0]}
          %1:f64[5,5] = matmul %q, %0
          %2:f64[5,5] = softmax %1 {axis=-1}
          %3:f64[5,4] = matmul %2, %v
          return y=%3, scores=%1
        }
    """)
    assert not r.changed
    (site,) = [s for s in sites if s.anchor == "%3"]
    assert site.reason == "the matmul result (%1) is used elsewhere and the fused op does not return it"


def test_a_transpose_used_elsewhere_stays_and_the_fused_op_gets_its_own():
    g, r, sites = _sites("""
        graph g(%q: f64[5,4], %k: f64[5,4], %v: f64[5,4]) {
          %0:f64[4,5] = transpose %k {perm=[1,0]}
          %1:f64[5,5] = matmul %q, %0
          %2:f64[5,5] = softmax %1 {axis=-1}
          %3:f64[5,4] = matmul %2, %v
          %4:f64[4,5] = tanh %0
          return y=%3, t=%4
        }
    """)
    assert str(r.graph) == ir("""
        graph g(%q: f64[5,4], %k: f64[5,4], %v: f64[5,4]) {
          %0:f64[4,5] = transpose %k {perm=[1,0]}
          %1:f64[5,4] = transpose %0 {perm=[1,0]}
          %2:f64[5,4] = attention %q, %1, %v {scale=1.0, mask="none", causal=false, fill=-3.4028234663852886e+38, guarded=false}
          %3:f64[4,5] = tanh %0
          return y=%2, t=%3
        }
    """)
    assert_same_numbers(g, r.graph)


def test_softmax_over_another_axis_does_not_fuse():
    g, r, sites = _sites("""
        graph g(%q: f64[5,4], %kt: f64[4,5], %v: f64[5,4]) {
          %0:f64[5,5] = matmul %q, %kt
          %1:f64[5,5] = softmax %0 {axis=0}
          %2:f64[5,4] = matmul %1, %v
          return y=%2
        }
    """)
    assert not r.changed
    (site,) = [s for s in sites if s.anchor == "%2"]
    assert site.reason == "softmax is not over the last axis"


def test_v_computed_by_the_scores_matmul_does_not_fuse():
    # softmax(q kᵀ) @ (q kᵀ): the fused op cannot read a value whose node it removes.
    g, r, sites = _sites("""
        graph g(%q: f64[4,4], %kt: f64[4,4]) {
          %0:f64[4,4] = matmul %q, %kt
          %1:f64[4,4] = softmax %0 {axis=-1}
          %2:f64[4,4] = matmul %1, %0
          return y=%2
        }
    """)
    assert not r.changed and str(r.graph) == str(g)
    (site,) = [s for s in sites if s.anchor == "%2"]
    assert site.reason == "the matmul result (%0) inside the pattern is also an input (v)"
