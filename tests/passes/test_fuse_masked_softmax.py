"""fuse_masked_softmax: golden IR text; every scale/mask variant the pass's
docstring lists fuses with the right attributes and the same numbers; sites
that do not fit are rejected with a reason."""
import numpy as np
import pytest

from blockc import parse_graph
from blockc.passes.fuse_masked_softmax import fuse_masked_softmax
from blockc.passes.manager import label_origins
from pass_testing import assert_same_numbers, check_golden, ir, nodes_of, run_pass

F32_MIN = float(np.finfo(np.float32).min)


def test_golden_docstring_example():
    r = check_golden(fuse_masked_softmax, """
        graph g(%q: f32[b,h,s,16], %kt: f32[b,h,16,s]) {
          %0:f32[b,h,s,s] = matmul %q, %kt
          %1:f32[] = constant {value=dense<f32[]: [0.125]>}
          %2:f32[b,h,s,s] = mul %0, %1
          %3:bool[s,s] = causal_mask {rows=s, cols=s}
          %4:f32[] = constant {value=dense<f32[]: [-3.4028234663852886e+38]>}
          %5:f32[b,h,s,s] = where %3, %2, %4
          %6:f32[b,h,s,s] = softmax %5 {axis=-1}
          return y=%6
        }
    """, """
        graph g(%q: f32[b,h,s,16], %kt: f32[b,h,16,s]) {
          %0:f32[b,h,s,s] = matmul %q, %kt
          %1:f32[] = constant {value=dense<f32[]: [0.125]>}
          %2:bool[s,s] = causal_mask {rows=s, cols=s}
          %3:f32[] = constant {value=dense<f32[]: [-3.4028234663852886e+38]>}
          %4:f32[b,h,s,s] = masked_softmax %0 {scale=0.125, mask="none", causal=true, fill=-3.4028234663852886e+38}
          return y=%4
        }
    """)
    (site,) = r.sites
    assert site.fused and site.kind == "masked_softmax" and site.ops == ["mul", "where", "softmax"]


def test_golden_additive_mask_and_divisor():
    check_golden(fuse_masked_softmax, """
        graph g(%s: f64[2,3,5,5], %m: f64[2,1,1,5]) {
          %0:f64[] = constant {value=dense<f64[]: [4.0]>}
          %1:f64[2,3,5,5] = div %s, %0
          %2:f64[2,3,5,5] = add %m, %1
          %3:f64[2,3,5,5] = softmax %2 {axis=3}
          return y=%3
        }
    """, """
        graph g(%s: f64[2,3,5,5], %m: f64[2,1,1,5]) {
          %0:f64[] = constant {value=dense<f64[]: [4.0]>}
          %1:f64[2,3,5,5] = masked_softmax %s, %m {scale=0.25, mask="additive", causal=false, fill=-3.4028234663852886e+38}
          return y=%1
        }
    """)


HEADER = "graph g(%s: f64[2,3,5,5], %m: f64[2,1,1,5], %b: bool[2,1,1,5]) {"
CONSTS = """
  %c0:f64[] = constant {value=dense<f64[]: [0.25]>}
  %c1:f64[] = constant {value=dense<f64[]: [4.0]>}
  %c2:f64[] = constant {value=dense<f64[]: [-1000000000.0]>}
  %c3:bool[5,5] = causal_mask {rows=5, cols=5}
  %c4:f64[] = constant {value=dense<f64[]: [-10000.0]>}
"""

# name: (the scores' lines, ending in %p; the expected attrs; the mask input)
VARIANTS = {
    "scale mul, constant right": (["%p = mul %s, %c0"], dict(scale=0.25), None),
    "scale mul, constant left": (["%p = mul %c0, %s"], dict(scale=0.25), None),
    "scale div": (["%p = div %s, %c1"], dict(scale=0.25), None),
    "additive, mask right": (["%p = add %s, %m"], dict(mask="additive"), "m"),
    "additive, mask left": (["%p = add %m, %s"], dict(mask="additive"), "m"),
    "scale then additive": (["%t = mul %s, %c0", "%p = add %m, %t"], dict(scale=0.25, mask="additive"), "m"),
    "bool": (["%p = where %b, %s, %c2"], dict(mask="bool", fill=-1e9), "b"),
    "scale then bool": (["%t = div %s, %c1", "%p = where %b, %t, %c4"],
                        dict(scale=0.25, mask="bool", fill=-1e4), "b"),
    "causal": (["%p = where %c3, %s, %c2"], dict(causal=True, fill=-1e9), None),
    "scale then causal": (["%t = mul %c0, %s", "%p = where %c3, %t, %c2"],
                          dict(scale=0.25, causal=True, fill=-1e9), None),
    "causal(additive)": (["%t = mul %s, %c0", "%u = add %t, %m", "%p = where %c3, %u, %c2"],
                         dict(scale=0.25, mask="additive", causal=True, fill=-1e9), "m"),
    "additive(causal)": (["%t = mul %s, %c0", "%u = where %c3, %t, %c2", "%p = add %m, %u"],
                         dict(scale=0.25, mask="additive", causal=True, fill=-1e9), "m"),
    "causal(bool)": (["%u = where %b, %s, %c2", "%p = where %c3, %u, %c2"],
                     dict(mask="bool", causal=True, fill=-1e9), "b"),
    "bool(causal)": (["%t = div %s, %c1", "%u = where %c3, %t, %c2", "%p = where %b, %u, %c2"],
                     dict(scale=0.25, mask="bool", causal=True, fill=-1e9), "b"),
}


def variant_graph(lines, softmax_axis=-1):
    """The graph of a variant (the parser takes any value names); intermediates are f64[2,3,5,5]."""
    body = [line.replace(" = ", ":f64[2,3,5,5] = ", 1) for line in lines]
    body.append(f"%y:f64[2,3,5,5] = softmax {'%p' if lines else '%s'} {{axis={softmax_axis}}}")
    text = HEADER + CONSTS + "".join(f"  {line}\n" for line in body) + "  return y=%y\n}\n"
    return parse_graph(text)


@pytest.mark.parametrize("name", VARIANTS)
def test_variant_fuses_with_the_right_attributes(name):
    lines, attrs, mask = VARIANTS[name]
    g = variant_graph(lines)
    r = run_pass(fuse_masked_softmax, g)
    assert r.changed
    (site,) = r.sites
    assert site.fused and site.kind == "masked_softmax" and site.result == "masked_softmax"
    assert sorted(site.ops) == sorted(["softmax"] + [line.split()[2] for line in lines])
    (node,) = nodes_of(r.graph, "masked_softmax")
    assert "softmax" not in r.graph.op_counts()
    want = dict(scale=1.0, mask="none", causal=False, fill=F32_MIN) | attrs
    assert node.attrs == want
    assert [v.name for v in node.inputs] == ["s"] + ([mask] if mask else [])
    assert node.outputs[0] is r.graph.output("y")
    assert_same_numbers(g, r.graph)


def _rejected(lines, softmax_axis=-1):
    g = label_origins(variant_graph(lines, softmax_axis))
    r = run_pass(fuse_masked_softmax, g)
    assert not r.changed
    assert str(r.graph) == str(g)
    (site,) = r.sites
    assert not site.fused and site.kind == "masked_softmax"
    return site.reason


def test_a_plain_softmax_does_not_fuse():
    assert _rejected([]) == "a plain softmax: no scale or mask to fuse"


@pytest.mark.parametrize("axis", [0, 2, -2])
def test_softmax_over_another_axis_does_not_fuse(axis):
    assert _rejected(["%p = mul %s, %c0"], axis) == f"softmax is over axis {axis}, not the last"


def test_causal_and_boolean_masks_with_different_fills_fuse_only_the_causal_one():
    # One fused op has one fill: the boolean where (fill -1e4) stays outside.
    g = variant_graph(["%u = where %b, %s, %c4", "%p = where %c3, %u, %c2"])
    r = run_pass(fuse_masked_softmax, g)
    (node,) = nodes_of(r.graph, "masked_softmax")
    assert node.attrs == dict(scale=1.0, mask="none", causal=True, fill=-1e9)
    assert node.inputs[0].producer.op == "where" and node.inputs[0].producer.inputs[0].name == "b"
    assert_same_numbers(g, r.graph)


def test_a_causal_mask_that_broadcasts_is_taken_as_a_boolean_mask():
    # A [1,5] "causal" mask (one query row) broadcast over 5 rows is not the
    # [5,5] causal mask the fused op computes from indices: it must not become
    # causal=true, but it is a fine boolean mask.
    g = parse_graph(ir("""
        graph g(%s: f64[2,3,5,5]) {
          %0:bool[1,5] = causal_mask {rows=1, cols=5}
          %1:f64[] = constant {value=dense<f64[]: [-1000000000.0]>}
          %2:f64[2,3,5,5] = where %0, %s, %1
          %3:f64[2,3,5,5] = softmax %2 {axis=-1}
          return y=%3
        }
    """))
    r = run_pass(fuse_masked_softmax, g)
    (node,) = nodes_of(r.graph, "masked_softmax")
    assert node.attrs == dict(scale=1.0, mask="bool", causal=False, fill=-1e9)
    assert node.inputs[1].producer.op == "causal_mask"
    assert_same_numbers(g, r.graph)


def test_scores_broadcast_up_by_a_mask_do_not_fuse():
    # where(causal[5,5], s[2,3,1,5], fill) is [2,3,5,5]: the fused op would
    # give the scores' shape, [2,3,1,5]. The site must be rejected, not fused
    # into a node of the wrong shape.
    g = label_origins(parse_graph(ir("""
        graph g(%s: f64[2,3,1,5]) {
          %0:bool[5,5] = causal_mask {rows=5, cols=5}
          %1:f64[] = constant {value=dense<f64[]: [-1000000000.0]>}
          %2:f64[2,3,5,5] = where %0, %s, %1
          %3:f64[2,3,5,5] = softmax %2 {axis=-1}
          %4:f64[2,3,5,5] = tanh %3
          return y=%4
        }
    """)))
    r = run_pass(fuse_masked_softmax, g)
    assert not r.changed
    assert str(r.graph) == str(g)
    (site,) = r.sites
    assert site.reason == "the fused op gives f64[2,3,1,5], the softmax it replaces gives f64[2,3,5,5]"


def test_a_scalar_of_higher_rank_does_not_change_the_result_shape():
    # mul by a [1,1,1] constant lifts [4,4] scores to [1,4,4].
    g = label_origins(parse_graph(ir("""
        graph g(%x: f64[4,4]) {
          %0:f64[1,1,1] = constant {value=dense<f64[1,1,1]: [0.5]>}
          %1:f64[1,4,4] = mul %x, %0
          %2:f64[1,4,4] = softmax %1 {axis=-1}
          return y=%2
        }
    """)))
    r = run_pass(fuse_masked_softmax, g)
    assert not r.changed
    assert r.sites[0].reason == "the fused op gives f64[4,4], the softmax it replaces gives f64[1,4,4]"


def test_a_masked_intermediate_used_elsewhere_blocks_the_fusion():
    g = label_origins(parse_graph(ir("""
        graph g(%s: f64[2,5], %m: f64[2,5]) {
          %0:f64[] = constant {value=dense<f64[]: [0.5]>}
          %1:f64[2,5] = mul %s, %0
          %2:f64[2,5] = add %1, %m
          %3:f64[2,5] = softmax %2 {axis=-1}
          return y=%3, masked=%2
        }
    """)))
    r = run_pass(fuse_masked_softmax, g)
    assert not r.changed and str(r.graph) == str(g)
    (site,) = r.sites
    assert site.reason == "the add result (%2) is used elsewhere and the fused op does not return it"
