"""The traffic model: each input read once and each output written once,
except where an op declares that its ideal kernel moves less -- a causal
softmax (and a causal attention's full-size mask) reads only the entries
its rows can see, counted exactly from ops/masking.py's rule."""
import blockc
import numpy as np
import pytest

from blockc.ops.masking import causal_mask_array, causal_visible
from blockc.report.traffic import node_traffic

SOFTMAX = """graph g(%s: f32[2,3,{rows},{cols}], %bias: f32[2,1,{rows},{cols}], %keep: bool[2,1,1,{cols}]) {{
  %0:f32[2,3,{rows},{cols}] = masked_softmax %s, %bias {{scale=0.5, mask="additive", causal={causal}, fill=-1e+30}}
  %1:f32[2,3,{rows},{cols}] = masked_softmax %s, %keep {{scale=0.5, mask="bool", causal={causal}, fill=-1e+30}}
  return a=%0, b=%1
}}
"""


@pytest.mark.parametrize("rows, cols", [(1, 1), (5, 5), (3, 8), (8, 3), (1, 9), (512, 512), (1000, 1), (0, 4)])
def test_causal_visible_counts_what_the_mask_allows(rows, cols):
    assert causal_visible(rows, cols) == int(causal_mask_array(rows, cols).sum())


@pytest.mark.parametrize("rows, cols", [(6, 6), (2, 9)])
def test_a_causal_softmax_reads_only_the_scores_its_rows_see(rows, cols):
    full = blockc.parse_graph(SOFTMAX.format(rows=rows, cols=cols, causal="false"))
    causal = blockc.parse_graph(SOFTMAX.format(rows=rows, cols=cols, causal="true"))
    seen = causal_visible(rows, cols) / (rows * cols)
    scores, bias, keep = (v.type.nbytes({}) for v in full.inputs)
    for k, extra in ((0, bias), (1, keep)):
        plain, masked = node_traffic(full.nodes[k], {}), node_traffic(causal.nodes[k], {})
        assert plain.read == scores + extra and plain.written == scores
        # the scores (and a mask as large as them) only where seen; a key mask [b,1,1,cols] and the output whole
        assert masked.read == int(scores * seen) + (int(extra * seen) if k == 0 else extra)
        assert masked.written == plain.written


def test_a_causal_attention_reads_q_k_v_whole_and_its_mask_where_seen():
    g = blockc.parse_graph("""graph g(%q: f32[1,2,4,4], %k: f32[1,2,4,4], %v: f32[1,2,4,4], %bias: f32[1,1,4,4]) {
  %0:f32[1,2,4,4] = attention %q, %k, %v, %bias {scale=0.5, mask="additive", causal=true, fill=-1e+30, guarded=false}
  return y=%0
}
""")
    # q, k and v are [.., 4, 4] too: shaped like the scores, but read whole (the mask is what is skipped)
    t = node_traffic(g.nodes[0], {})
    assert t.read == 3 * 128 + 64 * 10 // 16 and t.written == 128


def test_a_lookup_reads_only_the_entries_its_ids_pick():
    # GPT-2's embedding: 4 tokens read 4 rows of the table, not all 50257; a rotary reads each table's
    # rows at its positions; ids that would pick more entries than the table holds read it once
    g = blockc.parse_graph("""graph g(%ids: i64[2,2], %many: i64[70000], %x: f32[2,3,2,8], %pos: i64[2,2]) {
  param @wte: f32[50257,768]
  param @cos: f32[64,8]
  param @sin: f32[64,8]
  %0:f32[2,2,768] = gather @wte, %ids {axis=0}
  %1:f32[70000,768] = gather @wte, %many {axis=0}
  %2:f32[2,3,2,8] = rotary %x, @cos, @sin, %pos {interleaved=false}
  return e=%0, m=%1, r=%2
}
""")
    lookup, many, rotary = (node_traffic(n, {}) for n in g.nodes)
    assert lookup.read == 4 * 768 * 4 + 4 * 8 and lookup.written == 4 * 768 * 4
    assert many.read == 50257 * 768 * 4 + 70000 * 8
    assert rotary.read == 2 * 3 * 2 * 8 * 4 + 2 * (4 * 8 * 4) + 4 * 8 and rotary.written == 2 * 3 * 2 * 8 * 4
