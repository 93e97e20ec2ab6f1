"""Constant folding at import goes through each op's registered numpy rule
(``ops/evaluate.fold``), so an ONNX file's constants fold as the same file
runs: checked against ONNX Runtime on the file itself."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from blockc.frontends.onnx import load_onnx
from blockc.runtime.backend import make_backend
from ort_sessions import peer_session  # noqa: E402  (tests/: the shared helper)


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
    return peer_session(str(path)).run(None, feeds)[0]


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


INTS = np.array([[3, -7], [5, 2]], np.int64)
SCALAR = np.array(2.25, np.float32)   # a one-element float initializer is a constant, not a weight
BOOLS = np.array([True, False])
# ONNX op, its inputs (all known), its attributes: the blockc op that computes it
FOLDED = {
    "Add": ([INTS, INTS], {}, "add"), "Sub": ([INTS, INTS], {}, "sub"), "Mul": ([INTS, INTS], {}, "mul"),
    "Div": ([INTS, INTS], {}, "div"), "Pow": ([SCALAR, SCALAR], {}, "pow"),
    "Equal": ([INTS, INTS], {}, "equal"), "Less": ([INTS, INTS], {}, "less"),
    "Greater": ([INTS, INTS], {}, "greater"), "And": ([BOOLS, BOOLS], {}, "logical_and"),
    "Or": ([BOOLS, BOOLS], {}, "logical_or"), "Not": ([BOOLS], {}, "logical_not"),
    "IsNaN": ([SCALAR], {}, "equal"), "Neg": ([INTS], {}, "neg"), "Sqrt": ([SCALAR], {}, "sqrt"),
    "Exp": ([SCALAR], {}, "exp"), "Relu": ([INTS], {}, "relu"), "Erf": ([SCALAR], {}, "erf"),
    "Sigmoid": ([SCALAR], {}, "sigmoid"), "Max": ([INTS, INTS], {}, "greater"),
    "Where": ([BOOLS, INTS[0], INTS[1]], {}, "where"), "ReduceSum": ([INTS], {"keepdims": 0}, "reduce_sum"),
    "Gather": ([INTS, np.array(1)], {"axis": 1}, "gather"), "Concat": ([INTS, INTS], {"axis": 1}, "concat"),
    "Transpose": ([INTS], {}, "transpose"), "Cast": ([INTS], {"to": TensorProto.FLOAT}, "cast"),
    "Flatten": ([INTS], {"axis": 0}, "reshape"),
}


@pytest.mark.parametrize("op", list(FOLDED))
def test_import_folds_with_the_ops_own_numpy_rule(op, tmp_path, monkeypatch):
    """One meaning for each op: the import folds constants by calling the
    registered rule of the blockc op it would emit, not a rule of its own."""
    from blockc.frontends import trace
    from blockc.frontends.onnx import OnnxModel
    from blockc.ir.opdef import get
    arrays, attrs, ir_op = FOLDED[op]
    names = [f"c{i}" for i in range(len(arrays))]
    path = _file(tmp_path, helper.make_node(op, names, ["Y"], **attrs), [], dict(zip(names, arrays)), 0)
    calls = []
    rule = get(ir_op).numpy_fn
    monkeypatch.setattr(get(ir_op), "numpy_fn", lambda xs, a, env: calls.append(ir_op) or rule(xs, a, env))
    graph = trace(OnnxModel(path))
    assert calls, f"{op} was folded without {ir_op}'s numpy rule"
    assert [n.op for n in graph.nodes] == ["constant"]


def test_integer_mod_is_refused_not_folded(tmp_path):
    """Mod (fmod=0 takes the divisor's sign: Mod(-7, 2) is 1 in ONNX Runtime) has no blockc op: refused by name."""
    from blockc.errors import OnnxFileError
    path = _file(tmp_path, helper.make_node("Mod", ["a", "b"], ["Y"]), [], {"a": A, "b": B}, TensorProto.INT64)
    np.testing.assert_array_equal(_ort(path, {})[:2], [1, 1])
    with pytest.raises(OnnxFileError, match=r"ai.onnx::Mod \(opset 17\)"):
        load_onnx(path)
