"""fuse_cache_attention: the in-place cache (a buffer written, its first rows
read) fuses into cache_attention; an exporter's appended cache
(``concat(past, new)``, a present longer than its past) into
append_attention, plain or grouped; a concat off the rows does not, and the
site says why."""
import pytest

from blockc import parse_graph
from blockc.passes.fuse_cache_attention import fuse_cache_attention
from blockc.passes.manager import label_origins
from pass_testing import check_golden, ir, run_pass

IN_PLACE = """
    graph g(%q: f32[b,4,seq,16], %k: f32[b,4,seq,16], %v: f32[b,4,seq,16], %ck: f32[b,4,64,16], %cv: f32[b,4,64,16]) {
      %0:f32[b,4,64,16] = cache_write %ck, %k {axis=2, start=past}
      %1:f32[b,4,64,16] = cache_write %cv, %v {axis=2, start=past}
      %2:f32[b,4,past+seq,16] = slice %0 {axis=2, start=0, end=past+seq}
      %3:f32[b,4,past+seq,16] = slice %1 {axis=2, start=0, end=past+seq}
      %4:f32[b,4,seq,16] = attention %q, %2, %3 {scale=0.25, mask="none", causal=true, fill=-3.4028234663852886e+38, guarded=false}
      return y=%4, pk=%0, pv=%1
    }
"""


def test_in_place_cache_fuses():
    check_golden(fuse_cache_attention, IN_PLACE, """
    graph g(%q: f32[b,4,seq,16], %k: f32[b,4,seq,16], %v: f32[b,4,seq,16], %ck: f32[b,4,64,16], %cv: f32[b,4,64,16]) {
      %0:f32[b,4,seq,16], %1:f32[b,4,64,16], %2:f32[b,4,64,16] = cache_attention %q, %k, %v, %ck, %cv {scale=0.25, mask="none", causal=true, fill=-3.4028234663852886e+38, guarded=false, start=past}
      return y=%0, pk=%1, pv=%2
    }
    """, numbers=False)


APPENDED = """
    graph g(%q: f32[b,4,seq,16], %k: f32[b,4,seq,16], %v: f32[b,4,seq,16], %pk: f32[b,4,past,16], %pv: f32[b,4,past,16]) {
      %0:f32[b,4,past+seq,16] = concat %pk, %k {axis=AXIS}
      %1:f32[b,4,past+seq,16] = concat %pv, %v {axis=2}
      %2:f32[b,4,seq,16] = attention %q, %0, %1 {scale=0.25, mask="none", causal=true, fill=-3.4028234663852886e+38, guarded=false}
      return y=%2, present_k=%0, present_v=%1
    }
"""


def _site(text):
    g = label_origins(parse_graph(ir(text)))
    r = run_pass(fuse_cache_attention, g)
    assert not r.changed and str(r.graph) == str(g)
    (site,) = [s for s in r.sites if s.anchor == "%2" and s.kind == "append_attention"]
    return site.reason


@pytest.mark.parametrize("axis", [2, -2])
def test_appended_cache_fuses(axis):
    check_golden(fuse_cache_attention, APPENDED.replace("AXIS", str(axis)), """
    graph g(%q: f32[b,4,seq,16], %k: f32[b,4,seq,16], %v: f32[b,4,seq,16], %pk: f32[b,4,past,16], %pv: f32[b,4,past,16]) {
      %0:f32[b,4,seq,16], %1:f32[b,4,past+seq,16], %2:f32[b,4,past+seq,16] = append_attention %q, %k, %v, %pk, %pv {scale=0.25, mask="none", causal=true, fill=-3.4028234663852886e+38, guarded=false}
      return y=%0, present_k=%1, present_v=%2
    }
    """, dims={"past": 3})


def test_appended_grouped_cache_fuses_with_its_guard():
    # grouped-query attention (fuse_repeat_kv's form) with the SDPA guard (fuse_attention's)
    check_golden(fuse_cache_attention, """
    graph g(%q: f32[b,2,2,seq,8], %k: f32[b,2,seq,8], %v: f32[b,2,seq,8], %pk: f32[b,2,past,8], %pv: f32[b,2,past,8], %m: bool[b,1,1,seq,past+seq]) {
      %0:f32[b,2,past+seq,8] = concat %pk, %k {axis=2}
      %1:f32[b,2,past+seq,8] = concat %pv, %v {axis=2}
      %2:f32[b,2,1,past+seq,8] = reshape %0 {shape=[0,2,1,-1,8]}
      %3:f32[b,2,1,past+seq,8] = reshape %1 {shape=[0,2,1,-1,8]}
      %4:f32[b,2,2,seq,8] = attention %q, %2, %3, %m {scale=0.25, mask="bool", causal=false, fill=-3.4028234663852886e+38, guarded=true}
      return y=%4, present_k=%0, present_v=%1
    }
    """, """
    graph g(%q: f32[b,2,2,seq,8], %k: f32[b,2,seq,8], %v: f32[b,2,seq,8], %pk: f32[b,2,past,8], %pv: f32[b,2,past,8], %m: bool[b,1,1,seq,past+seq]) {
      %0:f32[b,2,2,seq,8], %1:f32[b,2,past+seq,8], %2:f32[b,2,past+seq,8] = append_attention %q, %k, %v, %pk, %pv, %m {scale=0.25, mask="bool", causal=false, fill=-3.4028234663852886e+38, guarded=true}
      return y=%0, present_k=%1, present_v=%2
    }
    """, dims={"past": 3})


def test_concat_off_the_rows_is_no_cache():
    assert _site("""
        graph g(%q: f32[b,4,seq,16], %k: f32[b,4,seq,8], %v: f32[b,4,seq,8], %pk: f32[b,4,seq,8], %pv: f32[b,4,seq,8]) {
          %0:f32[b,4,seq,16] = concat %pk, %k {axis=3}
          %1:f32[b,4,seq,16] = concat %pv, %v {axis=3}
          %2:f32[b,4,seq,16] = attention %q, %0, %1 {scale=0.25, mask="none", causal=true, fill=-3.4028234663852886e+38, guarded=false}
          return y=%2
        }
    """) == "the k cache is a concat along axis 3 of f32[b,4,seq,16], not [batch, kv_heads, len, head_size] " \
            "appended along its rows"
