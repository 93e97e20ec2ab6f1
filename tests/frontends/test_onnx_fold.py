"""Constant folding at import goes through each op's registered numpy rule
(``ops/evaluate.fold``), so an ONNX file's constants fold as the same file
runs: checked against ONNX Runtime on the file itself."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from blockc.frontends.onnx import load_onnx
from blockc.runtime.backend import make_backend

ort = pytest.importorskip("onnxruntime")

A = np.array([-7, 7, -7, 7, -8, -1, 0, 9, -9], np.int64)
B = np.array([2, 2, -2, -2, 2, 3, 5, -4, 4], np.int64)


def _file(tmp_path, node, inputs, initializers, dtype):
    graph = helper.make_graph(
        [node], "g", inputs, [helper.make_tensor_value_info("Y", dtype, None)],
        initializer=[onnx.numpy_helper.from_array(v, k) for k, v in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    return path


def _ort(path, feeds):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _blockc(path, feeds):
    graph, weights = load_onnx(path)
    with make_backend("reference", float64=True).compile(graph, weights) as compiled:
        return next(iter(compiled.run(feeds).values()))


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_integer_div_folds_truncating_as_onnx_runtime_computes(tmp_path, dtype):
    """Both operands known: the import folds Div; ONNX truncates (-7 / 2 is -3)."""
    a, b = A.astype(dtype), B.astype(dtype)
    code = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    path = _file(tmp_path, helper.make_node("Div", ["a", "b"], ["Y"]), [], {"a": a, "b": b}, code)
    theirs = _ort(path, {})
    np.testing.assert_array_equal(theirs, [-3, 3, 3, -3, -4, 0, 0, -2, -2])
    ours = _blockc(path, {})
    assert ours.dtype == theirs.dtype
    np.testing.assert_array_equal(ours, theirs)


def test_integer_div_run_truncates_as_onnx_runtime_computes(tmp_path):
    """One operand a graph input: Div is the graph's own, run by the reference."""
    x = helper.make_tensor_value_info("a", TensorProto.INT64, [len(A)])
    path = _file(tmp_path, helper.make_node("Div", ["a", "b"], ["Y"]), [x], {"b": B}, TensorProto.INT64)
    np.testing.assert_array_equal(_blockc(path, {"a": A}), _ort(path, {"a": A}))
