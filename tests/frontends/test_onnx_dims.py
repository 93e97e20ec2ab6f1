"""The dims an ONNX file's names tie together, read by one rule
(``cache_io.summed_dim``): a dim_param that names a sum of the inputs' other
dims (Optimum's ``past_sequence_length + sequence_length``, blockc's
``past+seq``) is that sum, and so is a cache step's present length
(``total = past + seq``, ``cache_io.CacheIO.dims``), all in the symbols the
file's names get (``seq len`` is ``seq_len``, ``past__len`` is ``past_len``)."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from blockc.frontends import trace
from blockc.frontends.onnx import OnnxModel
from blockc.frontends.onnx.cache_io import summed_dim
from blockc.ir.dims import Sym

from test_onnx_import import check_against_ort


def cache_step_file(path, mask_length: str, seq: str, past: str = "past__len"):
    """A cache step's skeleton: the past keys and the step's appended into
    the present (``[batch, 2, total, 4]``), a mask ``mask_length`` long."""
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", seq])
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", mask_length])
    past_key = helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, ["batch", 2, past, 4])
    new_key = helper.make_tensor_value_info("key", TensorProto.FLOAT, ["batch", 2, seq, 4])
    present = helper.make_tensor_value_info("present.0.key", TensorProto.FLOAT, ["batch", 2, "total", 4])
    kept = helper.make_tensor_value_info("kept", TensorProto.FLOAT, ["batch", 2, mask_length, 4])
    nodes = [helper.make_node("Concat", ["past_key_values.0.key", "key"], ["present.0.key"], axis=2),
             helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["mask_f", "axes"], ["mask_4d"]),
             helper.make_node("Mul", ["present.0.key", "mask_4d"], ["kept"]),
             helper.make_node("Identity", ["input_ids"], ["ids_out"])]
    axes = onnx.numpy_helper.from_array(np.array([1, 3], np.int64), "axes")
    ids_out = helper.make_tensor_value_info("ids_out", TensorProto.INT64, ["batch", seq])
    graph = helper.make_graph(nodes, "step", [ids, mask, past_key, new_key], [present, kept, ids_out],
                              initializer=[axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def test_summed_dim_reads_a_sum_of_named_dims():
    named = {"past_sequence_length", "sequence_length"}
    assert summed_dim("past_sequence_length + sequence_length", named) == ["past_sequence_length", "sequence_length"]
    assert summed_dim("past_sequence_length", named) is None          # not a sum
    assert summed_dim("past_sequence_length + other", named) is None  # a term no input names


# the present's length: total = past + seq (a cache step: its names must be
# identifiers), or a name that says the sum (any names)
@pytest.mark.parametrize("seq, mask_length", [("seq_len", "total"), ("seq len", "past__len + seq len"),
                                              ("seq_len", "seq_len+past__len")])
def test_sums_and_the_step_are_in_the_file_symbols(tmp_path, seq, mask_length):
    path = cache_step_file(tmp_path / "step.onnx", mask_length, seq)
    model = OnnxModel(path)
    mask = next(s for s in model.inputs() if s.name == "attention_mask")
    assert mask.shape[1] == Sym.var("past_len") + Sym.var("seq_len")
    assert trace(model).symbols() == ["batch", "seq_len", "past_len"]
    check_against_ort(path, dims=lambda seq: {"past_len": seq + 2})
