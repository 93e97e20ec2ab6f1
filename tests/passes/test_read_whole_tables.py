"""read_whole_tables: golden IR text; ops that index a prefix of a table by
input ids read the whole table, and nothing else changes; the ONNX export
runs it, and the bounds still hold for blockc's runs."""
import numpy as np
import pytest

import blockc
from blockc.codegen.onnx_export import export_onnx
from blockc.errors import InputsError
from blockc.passes.read_whole_tables import read_whole_tables
from blockc.runtime.backend import make_backend
from pass_testing import check_golden


def test_golden_gather_and_rotary_read_the_whole_tables():
    # ids lie in [0, 4), below seq=5: the prefix and the whole table give the same rows
    check_golden(read_whole_tables, """
        graph g(%x: f32[batch,4,seq,8], %ids: i64[batch,seq]) {
          param @cos: f32[16,8]
          param @sin: f32[16,8]
          param @pos: f32[16,32]
          %0:f32[seq,8] = slice @cos {axis=0, start=0, end=seq}
          %1:f32[seq,8] = slice @sin {axis=0, start=0, end=seq}
          %2:f32[seq,32] = slice @pos {axis=0, start=0, end=seq}
          %3:f32[batch,4,seq,8] = rotary %x, %0, %1, %ids {interleaved=false}
          %4:f32[batch,seq,32] = gather %2, %ids {axis=0}
          return y=%3, p=%4
        }
    """, """
        graph g(%x: f32[batch,4,seq,8], %ids: i64[batch,seq]) {
          param @cos: f32[16,8]
          param @sin: f32[16,8]
          param @pos: f32[16,32]
          %0:f32[batch,4,seq,8] = rotary %x, @cos, @sin, %ids {interleaved=false}
          %1:f32[batch,seq,32] = gather @pos, %ids {axis=0}
          return y=%0, p=%1
        }
    """)


def test_golden_a_prefix_read_otherwise_stays_for_that_reader():
    check_golden(read_whole_tables, """
        graph g(%ids: i64[seq]) {
          param @pos: f32[16,32]
          %0:f32[seq,32] = slice @pos {axis=0, start=0, end=seq}
          %1:f32[seq,32] = gather %0, %ids {axis=0}
          %2:f32[seq,32] = add %1, %0
          return y=%2, table=%0
        }
    """, """
        graph g(%ids: i64[seq]) {
          param @pos: f32[16,32]
          %0:f32[seq,32] = slice @pos {axis=0, start=0, end=seq}
          %1:f32[seq,32] = gather @pos, %ids {axis=0}
          %2:f32[seq,32] = add %1, %0
          return y=%2, table=%0
        }
    """)


@pytest.mark.parametrize("why, text", [
    ("the prefix does not start at row 0: ids count from its start", """
        graph g(%ids: i64[seq]) {
          param @pos: f32[16,32]
          %0:f32[seq,32] = slice @pos {axis=0, start=1, end=seq+1}
          %1:f32[seq,32] = gather %0, %ids {axis=0}
          return y=%1
        }
    """),
    ("the slice is across the columns, the ids pick rows", """
        graph g(%ids: i64[seq]) {
          param @pos: f32[16,32]
          %0:f32[16,seq] = slice @pos {axis=1, start=0, end=seq}
          %1:f32[seq,seq] = gather %0, %ids {axis=0}
          return y=%1
        }
    """),
    ("the ids are computed, so no feed check bounds them: the prefix is their bound", """
        graph g(%ids: i64[seq]) {
          param @pos: f32[16,32]
          %0:f32[seq,32] = slice @pos {axis=0, start=0, end=seq}
          %1:i64[seq] = neg %ids
          %2:f32[seq,32] = gather %0, %1 {axis=0}
          return y=%2
        }
    """),
])
def test_golden_left_alone(why, text):
    check_golden(read_whole_tables, text, text)


def _slices_of(proto, names):
    """Slice nodes of the exported ``proto`` whose data is one of ``names`` at a row count set at run time."""
    consts = {i.name for i in proto.graph.initializer}
    return [n for n in proto.graph.node if n.op_type == "Slice" and n.input[0] in names
            and not all(x in consts for x in n.input[1:])]


@pytest.mark.parametrize("model, tables", [("llama-tiny", {"rope.cos", "rope.sin"}), ("tiny", {"pos.weight"})])
def test_an_exported_decode_step_copies_no_table_rows_and_blockc_still_bounds_the_ids(model, tables):
    m = blockc.build_model(model, {"layers": "1"})
    graph = blockc.to_form(blockc.trace(m.for_cache("decode", cache_len=16)), "fused")
    weights = dict(blockc.init_weights(m))
    assert _slices_of(export_onnx(graph, weights), tables) == []
    kv = m.cfg.kv_heads or m.cfg.heads
    caches = {v.name: np.zeros((1, kv, 16, m.cfg.head_size), np.float32)
              for v in graph.inputs if v.name.startswith("past")}
    feeds = {"input_ids": np.array([[3]], np.int64), "attention_mask": np.ones((1, 5), np.int64), **caches}
    with make_backend("ort-cpu").compile(graph, weights) as compiled:
        want = make_backend("reference").run(graph, weights, {**feeds, "position_ids": np.array([[4]], np.int64)})
        got = compiled.run({**feeds, "position_ids": np.array([[4]], np.int64)})
        np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-4, atol=1e-5)
        # position 5 is inside the table but not below total=5: the graph blockc checks keeps the bound
        with pytest.raises(InputsError, match=r"input 'position_ids'.* out of range \[0, 5\)"):
            compiled.run({**feeds, "position_ids": np.array([[5]], np.int64)})
