"""fuse_repeat_kv: golden IR text for attention over K/V repeated per query
head (Hugging Face's ``repeat_kv``, as torch.onnx writes it) becoming the
grouped form; masks with and without a heads axis; the numbers (float64
reference) of the repeat against the grouping; sites that must not fuse."""
from blockc import parse_graph
from blockc.passes.fuse_repeat_kv import fuse_repeat_kv
from blockc.passes.manager import label_origins
from pass_testing import check_golden, fused, ir, run_pass


def _repeat(x, at, kv_heads=2, n_rep=2, d=8):
    """[batch, kv_heads, seq, d] %x repeated per head as nodes %at.. %at+2 (Unsqueeze, Expand, Reshape)."""
    return f"""
          %{at}:f64[batch,{kv_heads},1,seq,{d}] = reshape %{x} {{shape=[batch,{kv_heads},1,seq,{d}]}}
          %{at + 1}:f64[batch,{kv_heads},{n_rep},seq,{d}] = expand %{at} {{shape=[batch,{kv_heads},{n_rep},seq,{d}]}}
          %{at + 2}:f64[batch,{kv_heads * n_rep},seq,{d}] = reshape %{at + 1} {{shape=[batch,{kv_heads * n_rep},seq,{d}]}}"""


def test_golden_with_a_padding_mask():
    # The mask has no heads axis: it gains the group axis; K and V are read
    # as [batch, 2, 1, seq, 8], broadcast over each group of 2 query heads.
    r = check_golden(fuse_repeat_kv, """
        graph g(%q: f64[batch,4,seq,8], %k: f64[batch,2,seq,8], %v: f64[batch,2,seq,8], %m: f64[batch,1,seq,seq]) {"""
        + _repeat("k", 0) + _repeat("v", 3) + """
          %6:f64[batch,4,seq,8] = attention %q, %2, %5, %m {scale=0.25, mask="additive", causal=false, fill=-1000000000.0, guarded=false}
          return y=%6
        }
    """, """
        graph g(%q: f64[batch,4,seq,8], %k: f64[batch,2,seq,8], %v: f64[batch,2,seq,8], %m: f64[batch,1,seq,seq]) {
          %0:f64[batch,2,1,seq,8] = reshape %k {shape=[batch,2,1,seq,8]}
          %1:f64[batch,2,1,seq,8] = reshape %v {shape=[batch,2,1,seq,8]}
          %2:f64[batch,2,2,seq,8] = reshape %q {shape=[0,2,2,-1,8]}
          %3:f64[batch,1,1,seq,seq] = reshape %m {shape=[batch,1,1,seq,seq]}
          %4:f64[batch,2,2,seq,8] = attention %2, %0, %1, %3 {scale=0.25, mask="additive", causal=false, fill=-1000000000.0, guarded=false}
          %5:f64[batch,4,seq,8] = reshape %4 {shape=[0,4,-1,8]}
          return y=%5
        }
    """)
    (site,) = fused(r.sites)
    assert site.kind == "grouped_attention" and site.ops == ["expand", "reshape"] * 2 + ["attention"]
    assert site.result == "reshape+reshape+attention+reshape"


def test_golden_causal_with_a_mask_per_head():
    # A mask over every query head is grouped as the queries are: head h is
    # (h // 2, h % 2), so the numbers only agree if it reads K/V head h // 2.
    check_golden(fuse_repeat_kv, """
        graph g(%q: f64[batch,4,seq,8], %k: f64[batch,1,seq,8], %v: f64[batch,1,seq,8], %m: bool[batch,4,seq,seq]) {"""
        + _repeat("k", 0, 1, 4) + _repeat("v", 3, 1, 4) + """
          %6:f64[batch,4,seq,8] = attention %q, %2, %5, %m {scale=0.25, mask="bool", causal=true, fill=-1000000000.0, guarded=false}
          return y=%6
        }
    """, """
        graph g(%q: f64[batch,4,seq,8], %k: f64[batch,1,seq,8], %v: f64[batch,1,seq,8], %m: bool[batch,4,seq,seq]) {
          %0:f64[batch,1,1,seq,8] = reshape %k {shape=[batch,1,1,seq,8]}
          %1:f64[batch,1,1,seq,8] = reshape %v {shape=[batch,1,1,seq,8]}
          %2:f64[batch,1,4,seq,8] = reshape %q {shape=[0,1,4,-1,8]}
          %3:bool[batch,1,4,seq,seq] = reshape %m {shape=[batch,1,4,seq,seq]}
          %4:f64[batch,1,4,seq,8] = attention %2, %0, %1, %3 {scale=0.25, mask="bool", causal=true, fill=-1000000000.0, guarded=false}
          %5:f64[batch,4,seq,8] = reshape %4 {shape=[0,4,-1,8]}
          return y=%5
        }
    """)


def _sites(text):
    g = label_origins(parse_graph(ir(text)))
    r = run_pass(fuse_repeat_kv, g)
    return g, r, [s for s in r.sites if s.anchor_op == "attention"]


def test_tiled_heads_are_declined():
    # torch's k.repeat(1, 2, 1, 1): the copies go before the K/V heads, so
    # query head h reads K/V head h % 2, which the grouped form cannot say.
    g, r, (site,) = _sites("""
        graph g(%q: f64[batch,4,seq,8], %k: f64[batch,2,seq,8], %v: f64[batch,2,seq,8]) {
          %0:f64[batch,1,2,seq,8] = reshape %k {shape=[batch,1,2,seq,8]}
          %1:f64[batch,2,2,seq,8] = expand %0 {shape=[batch,2,2,seq,8]}
          %2:f64[batch,4,seq,8] = reshape %1 {shape=[batch,4,seq,8]}
          %3:f64[batch,1,2,seq,8] = reshape %v {shape=[batch,1,2,seq,8]}
          %4:f64[batch,2,2,seq,8] = expand %3 {shape=[batch,2,2,seq,8]}
          %5:f64[batch,4,seq,8] = reshape %4 {shape=[batch,4,seq,8]}
          %6:f64[batch,4,seq,8] = attention %q, %2, %5 {scale=0.25, mask="none", causal=true, fill=-1000000000.0, guarded=false}
          return y=%6
        }
    """)
    assert not r.changed and str(r.graph) == str(g)
    assert site.reason == ("K's heads are tiled (query head h reads K head h % 2), not each repeated in a row "
                           "(head h // group) as grouped attention reads them")


def test_k_and_v_repeated_differently_are_declined():
    g, r, (site,) = _sites("""
        graph g(%q: f64[batch,4,seq,8], %k: f64[batch,2,seq,8], %v: f64[batch,1,seq,8]) {"""
        + _repeat("k", 0) + _repeat("v", 3, 1, 4) + """
          %6:f64[batch,4,seq,8] = attention %q, %2, %5 {scale=0.25, mask="none", causal=true, fill=-1000000000.0, guarded=false}
          return y=%6
        }
    """)
    assert not r.changed
    assert site.reason == "K has 2 heads repeated 2 times, V 1 repeated 4 times"


def test_repeated_keys_used_elsewhere_are_declined():
    g, r, (site,) = _sites("""
        graph g(%q: f64[batch,4,seq,8], %k: f64[batch,2,seq,8], %v: f64[batch,2,seq,8]) {"""
        + _repeat("k", 0) + _repeat("v", 3) + """
          %6:f64[batch,4,seq,8] = attention %q, %2, %5 {scale=0.25, mask="none", causal=true, fill=-1000000000.0, guarded=false}
          return y=%6, keys=%2
        }
    """)
    assert not r.changed
    assert site.reason == "the reshape result (%2) is used elsewhere and the fused op does not return it"


def test_attention_without_a_repeat_is_left_alone():
    g, r, (site,) = _sites("""
        graph g(%q: f64[batch,4,seq,8], %k: f64[batch,4,seq,8], %v: f64[batch,4,seq,8]) {
          %0:f64[batch,4,seq,8] = attention %q, %k, %v {scale=0.25, mask="none", causal=true, fill=-1000000000.0, guarded=false}
          return y=%0
        }
    """)
    assert not r.changed and not site.fused and site.depth <= 1
