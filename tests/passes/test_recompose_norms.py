"""recompose_norms: golden IR text for the decomposed LayerNorm/RMSNorm and the
variants in the pass's docstring; numbers equal; reasons when a site does not fit.

Matched constants (eps, 2) are not consumed -- another node may read them --
so they stay until ``dce``.
"""
import numpy as np
import pytest

from blockc import parse_graph
from blockc.passes.dce import dce
from blockc.passes.decompose import decompose
from blockc.passes.manager import label_origins
from blockc.passes.recompose_norms import recompose_norms
from pass_testing import assert_same_numbers, check_golden, fused, ir, run_pass

NORMS = """
    graph g(%x: f64[2,3,8], %y: f64[2,3,8]) {
      param @g: f64[8]
      param @b: f64[8]
      %0:f64[2,3,8] = layernorm %x, @g, @b {eps=1e-05}
      %1:f64[2,3,8] = rmsnorm %y, @g {eps=1e-06}
      return a=%0, b=%1
    }
"""

DECOMPOSED = """
    graph g(%x: f64[2,3,8], %y: f64[2,3,8]) {
      param @g: f64[8]
      param @b: f64[8]
      %0:f64[2,3,1] = reduce_mean %x {axes=[-1], keepdims=true}
      %1:f64[2,3,8] = sub %x, %0
      %2:f64[2,3,8] = mul %1, %1
      %3:f64[2,3,1] = reduce_mean %2 {axes=[-1], keepdims=true}
      %4:f64[] = constant {value=dense<f64[]: [1e-05]>}
      %5:f64[2,3,1] = add %3, %4
      %6:f64[2,3,1] = sqrt %5
      %7:f64[2,3,8] = div %1, %6
      %8:f64[2,3,8] = mul %7, @g
      %9:f64[2,3,8] = add %8, @b
      %10:f64[2,3,8] = mul %y, %y
      %11:f64[2,3,1] = reduce_mean %10 {axes=[-1], keepdims=true}
      %12:f64[] = constant {value=dense<f64[]: [1e-06]>}
      %13:f64[2,3,1] = add %11, %12
      %14:f64[2,3,1] = sqrt %13
      %15:f64[2,3,8] = div %y, %14
      %16:f64[2,3,8] = mul %15, @g
      return a=%9, b=%16
    }
"""


def test_golden_decomposed_forms():
    assert str(decompose(parse_graph(ir(NORMS))).graph) == ir(DECOMPOSED)
    r = check_golden(recompose_norms, DECOMPOSED, """
        graph g(%x: f64[2,3,8], %y: f64[2,3,8]) {
          param @g: f64[8]
          param @b: f64[8]
          %0:f64[] = constant {value=dense<f64[]: [1e-05]>}
          %1:f64[2,3,8] = layernorm %x, @g, @b {eps=1e-05}
          %2:f64[] = constant {value=dense<f64[]: [1e-06]>}
          %3:f64[2,3,8] = rmsnorm %y, @g {eps=1e-06}
          return a=%1, b=%3
        }
    """)
    assert [s.kind for s in fused(r.sites)] == ["layernorm", "rmsnorm"]
    # The inside of the LayerNorm, (x - mean) / sqrt(mean((x - mean)^2) + eps) * g,
    # is also an RMSNorm of x - mean: the rmsnorm rule must say no to it.
    inner = [s for s in r.sites if s.kind == "rmsnorm" and not s.fused and s.anchor_op == "mul" and s.depth > 2]
    assert [s.reason for s in inner] == ["the input is centred (x - mean(x)): this is the inside of a LayerNorm"]


def test_golden_variants():
    # LayerNorm with pow(xc, 2), xc * reciprocal(sigma) (reciprocal first),
    # eps + var, gamma * ..., beta + ...; RMSNorm with pow(y, 2),
    # reciprocal(rms) * y and gamma first.
    check_golden(recompose_norms, """
        graph g(%x: f64[2,3,8], %y: f64[2,3,8]) {
          param @g: f64[8]
          param @b: f64[8]
          %0:f64[2,3,1] = reduce_mean %x {axes=[2], keepdims=true}
          %1:f64[2,3,8] = sub %x, %0
          %2:f64[] = constant {value=dense<f64[]: [2.0]>}
          %3:f64[2,3,8] = pow %1, %2
          %4:f64[2,3,1] = reduce_mean %3 {axes=[-1], keepdims=true}
          %5:f64[] = constant {value=dense<f64[]: [0.001]>}
          %6:f64[2,3,1] = add %5, %4
          %7:f64[2,3,1] = sqrt %6
          %8:f64[2,3,1] = reciprocal %7
          %9:f64[2,3,8] = mul %8, %1
          %10:f64[2,3,8] = mul @g, %9
          %11:f64[2,3,8] = add @b, %10
          %12:f64[2,3,8] = pow %y, %2
          %13:f64[2,3,1] = reduce_mean %12 {axes=[-1], keepdims=true}
          %14:f64[2,3,1] = add %13, %5
          %15:f64[2,3,1] = sqrt %14
          %16:f64[2,3,1] = reciprocal %15
          %17:f64[2,3,8] = mul %16, %y
          %18:f64[2,3,8] = mul @g, %17
          return a=%11, b=%18
        }
    """, """
        graph g(%x: f64[2,3,8], %y: f64[2,3,8]) {
          param @g: f64[8]
          param @b: f64[8]
          %0:f64[] = constant {value=dense<f64[]: [2.0]>}
          %1:f64[] = constant {value=dense<f64[]: [0.001]>}
          %2:f64[2,3,8] = layernorm %x, @g, @b {eps=0.001}
          %3:f64[2,3,8] = rmsnorm %y, @g {eps=0.001}
          return a=%2, b=%3
        }
    """)


RMS_ONE_OVER = """
    graph g(%y: f64[2,3,8]) {{
      param @g: f64[8]
      %0:f64[] = constant {{value=dense<f64[]: [2.0]>}}
      %1:f64[2,3,8] = pow %y, %0
      %2:f64[2,3,1] = reduce_mean %1 {{axes=[-1], keepdims=true}}
      %3:f64[] = constant {{value=dense<f64[]: [1e-06]>}}
      %4:f64[2,3,1] = add %2, %3
      %5:f64[2,3,1] = sqrt %4
      %6:f64[] = constant {{value=dense<f64[]: [{one}]>}}
      %7:f64[2,3,1] = div %6, %5
      %8:f64[2,3,8] = mul %y, %7
      %9:f64[2,3,8] = mul @g, %8
      return b=%9
    }}
"""


def test_golden_one_over_sigma():
    # torch.rsqrt as the TorchScript exporter writes it (Hugging Face Llama's RMSNorm): y * (1 / sqrt(...))
    check_golden(recompose_norms, RMS_ONE_OVER.format(one="1.0"), """
        graph g(%y: f64[2,3,8]) {
          param @g: f64[8]
          %0:f64[] = constant {value=dense<f64[]: [2.0]>}
          %1:f64[] = constant {value=dense<f64[]: [1e-06]>}
          %2:f64[] = constant {value=dense<f64[]: [1.0]>}
          %3:f64[2,3,8] = rmsnorm %y, @g {eps=1e-06}
          return b=%3
        }
    """)
    g = label_origins(parse_graph(ir(RMS_ONE_OVER.format(one="2.0"))))
    r = run_pass(recompose_norms, g)
    assert not r.changed
    (site,) = [s for s in r.sites if s.anchor == "%9"]
    assert site.reason == "the numerator of 1/sigma is not 1"


def test_decompose_then_recompose_is_the_identity():
    r = run_pass(recompose_norms, decompose(parse_graph(ir(NORMS))).graph)
    assert str(dce(r.graph).graph) == ir(NORMS)  # dce drops the eps constants


def test_float32_eps_is_the_constant_the_graph_holds():
    # The decomposed float32 graph holds eps rounded to float32; the
    # recomposed op keeps that value, so both graphs compute the same thing.
    g = decompose(parse_graph(ir(NORMS).replace("f64", "f32"))).graph
    r = run_pass(recompose_norms, g)
    assert_same_numbers(g, r.graph)
    eps = {n.op: n.attrs["eps"] for n in r.graph.nodes if n.op != "constant"}
    assert eps == {"layernorm": float(np.float32(1e-5)), "rmsnorm": float(np.float32(1e-6))}


LAYERNORM = """
    graph g(%x: f64[2,3,8]) {{
      param @g: {gamma}
      param @b: f64[8]
      %0:{mean_type} = reduce_mean %x {{axes=[{axis}], keepdims=true}}
      %1:f64[2,3,8] = sub %x, %0
      %2:f64[2,3,8] = mul %1, %1
      %3:f64[2,3,1] = reduce_mean %2 {{axes=[-1], keepdims=true}}
      %4:f64[] = constant {{value=dense<f64[]: [{eps}]>}}
      %5:f64[2,3,1] = add %3, %4
      %6:f64[2,3,1] = sqrt %5
      %7:f64[2,3,8] = div %1, %6
      %8:f64[2,3,8] = mul %7, @g
      %9:f64[2,3,8] = add %8, @b
      return y=%9
    }}
"""
GOOD = dict(gamma="f64[8]", mean_type="f64[2,3,1]", axis=-1, eps="1e-05")


def test_the_layernorm_template_fuses():
    r = run_pass(recompose_norms, LAYERNORM.format(**GOOD))
    assert r.graph.op_counts()["layernorm"] == 1


@pytest.mark.parametrize("change, reason", [
    (dict(mean_type="f64[2,1,8]", axis=1), "the mean is not over the last axis"),
    (dict(eps="0.5"), "eps=0.5 does not look like a norm's epsilon"),
    (dict(gamma="f64[1]"), "gamma is f64[1], not a vector of the last axis"),
])
def test_layernorm_rejections_say_why(change, reason):
    g = label_origins(parse_graph(ir(LAYERNORM.format(**(GOOD | change)))))
    r = run_pass(recompose_norms, g)
    assert not r.changed and str(r.graph) == str(g)
    (site,) = [s for s in r.sites if s.anchor == "%9"]
    assert (site.kind, site.fused, site.reason) == ("layernorm", False, reason)


def test_an_intermediate_used_elsewhere_blocks_the_rewrite():
    text = LAYERNORM.format(**GOOD).replace("return y=%9", "return y=%9, sigma=%6")
    g = label_origins(parse_graph(ir(text)))
    r = run_pass(recompose_norms, g)
    assert not r.changed
    (site,) = [s for s in r.sites if s.anchor == "%9"]
    assert site.reason == "the sqrt result (%6) inside the pattern is used elsewhere"
