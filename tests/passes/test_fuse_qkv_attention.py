"""fuse_qkv_attention: golden IR text for the packed projection, head split,
attention core and head join becoming one op; sites that must not fuse; a
traced block, fused and with the pass switched off."""
import numpy as np
import pytest

from blockc import init_weights, parse_graph, trace
from blockc.frontends import BlockConfig, BlockModel
from blockc.passes.fuse_qkv_attention import fuse_qkv_attention
from blockc.passes.manager import label_origins, optimize
from pass_testing import assert_same_numbers, check_golden, fused, ir, nodes_of, run_pass

# The head split of q, k and v (%5..%10) as fuse_qkv and fuse_attention leave it.
BODY = """
          %0:f64[batch,seq,24] = matmul %x, %w
          %1:f64[batch,seq,24] = add %0, %b
          %2:f64[batch,seq,8], %3:f64[batch,seq,8], %4:f64[batch,seq,8] = split %1 {axis=-1, sizes=[8,8,8]}
          %5:f64[batch,seq,2,4] = reshape %2 {shape=[0,0,2,4]}
          %6:f64[batch,2,seq,4] = transpose %5 {perm=[0,2,1,3]}
          %7:f64[batch,seq,2,4] = reshape %3 {shape=[0,0,2,4]}
          %8:f64[batch,2,seq,4] = transpose %7 {perm=[0,2,1,3]}
          %9:f64[batch,seq,2,4] = reshape %4 {shape=[0,0,2,4]}
          %10:f64[batch,2,seq,4] = transpose %9 {perm=[0,2,1,3]}"""
# The head join back to [batch, seq, 8] that the fused op also takes in.
JOIN = """\
          %12:f64[batch,seq,2,4] = transpose %11 {perm=[0,2,1,3]}
          %13:f64[batch,seq,8] = reshape %12 {shape=[0,0,8]}
"""


def test_golden_causal():
    r = check_golden(fuse_qkv_attention, """
        graph g(%x: f64[batch,seq,8], %w: f64[8,24], %b: f64[24]) {""" + BODY + """
          %11:f64[batch,2,seq,4] = attention %6, %8, %10 {scale=0.5, mask="none", causal=true, fill=-1000000000.0, guarded=false}
""" + JOIN + """          return y=%13
        }
    """, """
        graph g(%x: f64[batch,seq,8], %w: f64[8,24], %b: f64[24]) {
          %0:f64[batch,seq,8] = qkv_attention %x, %w, %b {heads=2, sizes=[8,8,8], scale=0.5, mask="none", causal=true, fill=-1000000000.0, guarded=false}
          return y=%0
        }
    """)
    (site,) = fused(r.sites)
    assert site.kind == "qkv_attention" and site.result == "qkv_attention"
    assert site.ops == ["matmul", "add", "split"] + ["reshape", "transpose"] * 3 + ["attention", "transpose", "reshape"]


def test_golden_padding_mask_rides_along():
    # The bias added first (add %b, %0) and a boolean padding mask: both are matched as they come.
    check_golden(fuse_qkv_attention, """
        graph g(%x: f64[batch,seq,8], %w: f64[8,24], %b: f64[24], %m: bool[batch,1,1,seq]) {""" + BODY.replace(
        "add %0, %b", "add %b, %0") + """
          %11:f64[batch,2,seq,4] = attention %6, %8, %10, %m {scale=0.5, mask="bool", causal=false, fill=-1000000000.0, guarded=false}
""" + JOIN + """          return y=%13
        }
    """, """
        graph g(%x: f64[batch,seq,8], %w: f64[8,24], %b: f64[24], %m: bool[batch,1,1,seq]) {
          %0:f64[batch,seq,8] = qkv_attention %x, %w, %b, %m {heads=2, sizes=[8,8,8], scale=0.5, mask="bool", causal=false, fill=-1000000000.0, guarded=false}
          return y=%0
        }
    """)


def test_golden_guarded_attention_fuses_and_keeps_its_guard():
    # fuse_attention's SDPA form (a row with no key gives zeros) fuses as the plain one does.
    before = """
        graph g(%x: f64[batch,seq,8], %w: f64[8,24], %b: f64[24], %m: bool[batch,1,seq,seq]) {""" + BODY + """
          %11:f64[batch,2,seq,4] = attention %6, %8, %10, %m {scale=0.5, mask="bool", causal=true, fill=-1000000000.0, guarded=true}
""" + JOIN + """          return y=%13
        }
    """
    r = check_golden(fuse_qkv_attention, before, """
        graph g(%x: f64[batch,seq,8], %w: f64[8,24], %b: f64[24], %m: bool[batch,1,seq,seq]) {
          %0:f64[batch,seq,8] = qkv_attention %x, %w, %b, %m {heads=2, sizes=[8,8,8], scale=0.5, mask="bool", causal=true, fill=-1000000000.0, guarded=true}
          return y=%0
        }
    """)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 3, 8)), "w": rng.standard_normal((8, 24)), "b": rng.standard_normal(24),
             "m": np.ones((2, 1, 3, 3), bool)}
    feeds["m"][1] = False   # batch 1: no row sees a key, so its output is zero
    assert_same_numbers(parse_graph(ir(before)), r.graph, feeds=feeds)


def _rejected(text):
    g = label_origins(parse_graph(ir(text)))
    r = run_pass(fuse_qkv_attention, g)
    assert not r.changed and str(r.graph) == str(g)
    (site,) = [s for s in r.sites if s.depth > 1]
    return site


def test_heads_used_elsewhere_block_the_fusion():
    site = _rejected("""
        graph g(%x: f64[batch,seq,8], %w: f64[8,24], %b: f64[24]) {""" + BODY + """
          %11:f64[batch,2,seq,4] = attention %6, %8, %10 {scale=0.5, mask="none", causal=true, fill=-1000000000.0, guarded=false}
""" + JOIN + """          return y=%13, k=%8
        }
    """)
    assert site.reason == "the transpose result (%8) is used elsewhere and the fused op does not return it"


def test_q_and_k_from_the_wrong_parts_do_not_fuse():
    # q reads the split's second part: not the packed layout the fused op (and the runtime op) has
    site = _rejected("""
        graph g(%x: f64[batch,seq,8], %w: f64[8,24], %b: f64[24]) {""" + BODY + """
          %11:f64[batch,2,seq,4] = attention %8, %6, %10 {scale=0.5, mask="none", causal=true, fill=-1000000000.0, guarded=false}
""" + JOIN + """          return y=%13
        }
    """)
    assert site.reason == "expected output 0 of split"


def test_a_projection_without_bias_does_not_fuse():
    site = _rejected("""
        graph g(%x: f64[batch,seq,8], %w: f64[8,24]) {""" + BODY.replace(
        "      %1:f64[batch,seq,24] = add %0, %b\n", "").replace("split %1", "split %0") + """
          %11:f64[batch,2,seq,4] = attention %6, %8, %10 {scale=0.5, mask="none", causal=true, fill=-1000000000.0, guarded=false}
""" + JOIN + """          return y=%13
        }
    """)
    assert site.reason == "expected add, found a matmul result"


@pytest.mark.parametrize("causal", [True, False])
def test_in_a_traced_block_and_switched_off(causal):
    model = BlockModel(BlockConfig(d_model=16, heads=2, dtype="float64", causal=causal))
    g = trace(model)
    r = optimize(g)
    (node,) = nodes_of(r.graph, "qkv_attention")
    assert node.attrs["heads"] == 2 and list(node.attrs["sizes"]) == [16, 16, 16]
    assert node.attrs["causal"] is causal and node.attrs["scale"] == pytest.approx(8 ** -0.5, rel=1e-7)
    assert not {"attention", "split", "transpose"} & set(r.graph.op_counts())
    # the report names every original node once: the three projections and the softmax included
    (site,) = fused(r.sites, "qkv_attention")
    assert len(site.nodes) == len(set(site.nodes)) == len(node.origin)
    assert site.nodes == list(node.origin) and "attention" in site.ops
    originals = {f"%{i}": line for i, line in enumerate(
        line for line in str(g).splitlines() if line.strip().startswith("%"))}
    assert sum(" = matmul " in originals[label] for label in site.nodes) == 5   # Q, K, V, QKᵀ, PV
    rng = np.random.default_rng(0)
    feeds = {s.name: s.sample({"batch": 2, "seq": 5}, rng) for s in model.inputs()}
    weights = dict(init_weights(model, seed=1))
    assert_same_numbers(g, r.graph, weights=weights, feeds=feeds)

    off = optimize(g, disable=["fuse_qkv_attention"])
    assert not nodes_of(off.graph, "qkv_attention") and len(nodes_of(off.graph, "attention")) == 1
    assert not fused(off.sites, "qkv_attention")
