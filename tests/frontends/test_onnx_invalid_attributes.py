"""A node ONNX itself refuses is refused by blockc, never answered.

Random attributes (axes in and out of range, negative, repeated) on each
imported operator, checked against the peers that define validity: ONNX's
own full shape inference (strict) and ONNX Runtime, which loads and runs
the file. Whatever either rejects, blockc's import rejects with its own
error; where both accept, blockc computes what ONNX Runtime computes. Each
operator is drawn both on a graph input (traced) and on constants (folded
at import), the two paths an importer rule has."""
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, event, example, given, settings, strategies as st  # noqa: E402

from blockc.cli import main
from blockc.errors import BlockcError
from blockc.frontends.onnx import load_onnx
from blockc.runtime.backend import make_backend
from ort_sessions import peer_session  # noqa: E402  (tests/: the shared helper)


SHAPE = (2, 1, 3)
AXIS = st.integers(-5, 5)
AXES = st.lists(st.integers(-5, 5), min_size=1, max_size=3)


def _ints(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _file(nodes, x, initializers=(), opset=13, inputs=None):
    """A model of ``nodes`` reading ``X`` (``x``: a graph input when float,
    a constant when int64) and writing ``Y`` of its element type."""
    graph_inputs = list(inputs or [])
    inits = list(initializers)
    if x is not None and x.dtype == np.float32:
        graph_inputs.append(helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x.shape)))
    elif x is not None:
        inits.append(numpy_helper.from_array(x, "X"))
    out = TensorProto.INT64 if x is not None and x.dtype == np.int64 else TensorProto.FLOAT
    graph = helper.make_graph(nodes, "g", graph_inputs, [helper.make_tensor_value_info("Y", out, None)],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _x(known: bool, shape=SHAPE):
    data = np.arange(int(np.prod(shape))).reshape(shape)
    return data.astype(np.int64) if known else (data * 0.25 - 1).astype(np.float32)


def peers(model, feeds):
    """ONNX Runtime's output, or None where ONNX's strict shape inference or ONNX Runtime rejects the file."""
    try:
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
        session = peer_session(model.SerializeToString())
        return session.run(None, feeds)[0]
    except Exception:   # noqa: BLE001 -- the peers reject in their own exception types
        return None


def blockc_run(model, feeds):
    """blockc's output, or the BlockcError it refuses the file with."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "m.onnx"
        onnx.save(model, path)
        try:
            graph, weights = load_onnx(path)
            with make_backend("reference").compile(graph, weights) as compiled:
                return next(iter(compiled.run(feeds).values()))
        except BlockcError as e:
            return e


def check(model, feeds):
    theirs, ours = peers(model, feeds), blockc_run(model, feeds)
    event(f"ONNX {'rejects' if theirs is None else 'accepts'}, blockc "
          f"{'rejects' if isinstance(ours, BlockcError) else 'computes'}")
    if theirs is None:
        assert isinstance(ours, BlockcError), f"ONNX rejects this file, blockc computed {ours!r}"
    elif isinstance(ours, BlockcError):   # a valid file blockc cannot express: never called invalid
        assert "ONNX takes" not in str(ours) and "twice" not in str(ours), ours
    else:
        assert ours.shape == theirs.shape
        np.testing.assert_allclose(ours.astype(np.float64), theirs, rtol=1e-5, atol=1e-6)


def _feeds(x):
    return {"X": x} if x.dtype == np.float32 else {}


FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(op=st.sampled_from(["Softmax", "LogSoftmax"]), axis=AXIS, opset=st.sampled_from([11, 13]))
@example(op="Softmax", axis=7, opset=13)
def test_softmax_axis(op, axis, opset):
    x = _x(False)
    check(_file([helper.make_node(op, ["X"], ["Y"], axis=axis)], x, opset=opset), _feeds(x))


@FAST
@given(axis=AXIS, known=st.booleans())
@example(axis=7, known=False)
@example(axis=3, known=True)
def test_flatten_axis(axis, known):
    x = _x(known)
    check(_file([helper.make_node("Flatten", ["X"], ["Y"], axis=axis)], x), _feeds(x))


@FAST
@given(axes=AXES, known=st.booleans(), opset=st.sampled_from([11, 13]))
@example(axes=[7], known=False, opset=13)
@example(axes=[0, 0], known=True, opset=11)
def test_unsqueeze_axes(axes, known, opset):
    x = _x(known)
    if opset >= 13:
        node, inits = helper.make_node("Unsqueeze", ["X", "axes"], ["Y"]), [_ints("axes", axes)]
    else:
        node, inits = helper.make_node("Unsqueeze", ["X"], ["Y"], axes=axes), []
    check(_file([node], x, inits, opset=opset), _feeds(x))


@FAST
@given(axes=st.lists(st.integers(-5, 5), max_size=2), known=st.booleans())
@example(axes=[1], known=False)
@example(axes=[0, -1], known=True)
def test_squeeze_axes(axes, known):
    x = _x(known, (1, 2, 1, 3))
    node = helper.make_node("Squeeze", ["X", "axes"] if axes else ["X"], ["Y"])
    check(_file([node], x, [_ints("axes", axes)] if axes else []), _feeds(x))


@FAST
@given(axes=st.lists(st.integers(-4, 4), min_size=1, max_size=2), starts=st.lists(st.integers(-4, 4), min_size=1,
       max_size=2), ends=st.lists(st.integers(-4, 4) | st.just(2**62), min_size=2, max_size=2),
       steps=st.lists(st.sampled_from([1, 1, -1, 2, 0]), min_size=2, max_size=2), known=st.booleans())
@example(axes=[4], starts=[0], ends=[1, 1], steps=[1, 1], known=False)
@example(axes=[0, -3], starts=[0, 0], ends=[1, 1], steps=[1, 1], known=True)
@example(axes=[0], starts=[-3], ends=[-3, 0], steps=[-1, 1], known=True)   # ONNX clamps, not as Python does
def test_slice_axes(axes, starts, ends, steps, known):
    x = _x(known)
    n = len(axes)   # starts may be fewer than the axes
    inits = [_ints("s", starts[:n]), _ints("e", ends[:n]), _ints("a", axes), _ints("st", steps[:n])]
    check(_file([helper.make_node("Slice", ["X", "s", "e", "a", "st"], ["Y"])], x, inits), _feeds(x))


@FAST
@given(axis=AXIS, indices=st.lists(st.integers(-4, 4), max_size=2) | st.integers(-4, 4), known=st.booleans())
def test_gather_axis_and_indices(axis, indices, known):
    x = _x(known)
    check(_file([helper.make_node("Gather", ["X", "i"], ["Y"], axis=axis)], x, [_ints("i", indices)]), _feeds(x))


@FAST
@given(axis=AXIS, shift=st.integers(-4, 4), known=st.booleans())
def test_gather_elements_axis_and_indices(axis, shift, known):
    x = _x(known)
    indices = (np.arange(x.size).reshape(x.shape) % 3 + shift - 1).astype(np.int64)
    nodes = [helper.make_node("GatherElements", ["X", "i"], ["Y"], axis=axis)]
    check(_file(nodes, x, [numpy_helper.from_array(indices, "i")]), _feeds(x))


@FAST
@given(index=st.lists(st.integers(-3, 3), min_size=1, max_size=4), known=st.booleans())
def test_gather_nd_indices(index, known):
    x = _x(known)
    check(_file([helper.make_node("GatherND", ["X", "i"], ["Y"])], x, [_ints("i", [index])]), _feeds(x))


@FAST
@given(axis=AXIS, known=st.booleans())
def test_concat_axis(axis, known):
    x = _x(known)
    check(_file([helper.make_node("Concat", ["X", "X"], ["Y"], axis=axis)], x), _feeds(x))


@FAST
@given(perm=st.permutations([0, 1, 2]) | st.lists(st.integers(-3, 3), min_size=2, max_size=4), known=st.booleans())
def test_transpose_perm(perm, known):
    x = _x(known)
    check(_file([helper.make_node("Transpose", ["X"], ["Y"], perm=perm)], x), _feeds(x))


@FAST
@given(op=st.sampled_from(["ReduceMean", "ReduceSum", "ReduceMax"]), axes=AXES, keepdims=st.sampled_from([0, 1]),
       opset=st.sampled_from([13, 18]), known=st.booleans())
def test_reduce_axes(op, axes, keepdims, opset, known):
    x = _x(known and op != "ReduceMean")
    if op == "ReduceSum" or opset >= 18:
        node, inits = helper.make_node(op, ["X", "axes"], ["Y"], keepdims=keepdims), [_ints("axes", axes)]
    else:
        node, inits = helper.make_node(op, ["X"], ["Y"], axes=axes, keepdims=keepdims), []
    check(_file([node], x, inits, opset=opset), _feeds(x))


@FAST
@given(axis=AXIS, known=st.booleans(), sizes=st.lists(st.integers(-1, 3), min_size=1, max_size=3)
       | st.sampled_from([[2], [1, 1], [1], [3], [1, 2], [0, 3], [4, -1]]))
def test_split_axis_and_sizes(axis, known, sizes):
    x = _x(known)
    outs = [f"p{i}" for i in range(len(sizes))]
    nodes = [helper.make_node("Split", ["X", "sizes"], outs, axis=axis),
             helper.make_node("Identity", [outs[-1]], ["Y"])]
    check(_file(nodes, x, [_ints("sizes", sizes)]), _feeds(x))


@FAST
@given(scale=st.sampled_from([None, 0.0, -0.5, 0.5, 1.0]))
@example(scale=0.0)
def test_attention_scale(scale):
    q = np.linspace(-1, 1, 2 * 2 * 3 * 4, dtype=np.float32).reshape(2, 2, 3, 4)
    names = ["Q", "K", "V"]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(q.shape)) for n in names]
    attrs = {} if scale is None else {"scale": scale}
    model = _file([helper.make_node("Attention", names, ["Y"], **attrs)], None, opset=23, inputs=inputs)
    check(model, {"Q": q, "K": q[::-1].copy(), "V": q * 2})


def _node(op, inputs, **attrs):
    return helper.make_node(op, inputs, ["Y"], name="n", **attrs)


X2 = _x(False, (2, 3))
QKV = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 2, 3, 4]) for n in "QKV"]
# The cases, each refused through the command line by node and attribute (docs/BAD-INPUT.md).
REFUSED = {
    "Softmax axis=7": (_file([_node("Softmax", ["X"], axis=7)], X2),
                       "attribute axis 7 is out of range for a rank-2 tensor (ONNX takes -2 to 1)"),
    "Unsqueeze axes=[7]": (_file([_node("Unsqueeze", ["X", "a"])], X2, [_ints("a", [7])]),
                           "input axes [7]: axis 7 is out of range for a rank-3 tensor (ONNX takes -3 to 2)"),
    "Unsqueeze axes=[0, 0]": (_file([_node("Unsqueeze", ["X", "a"])], X2, [_ints("a", [0, 0])]),
                              "input axes [0, 0] names axis 0 twice (ONNX takes each axis once)"),
    "Squeeze of a 3": (_file([_node("Squeeze", ["X", "a"])], X2, [_ints("a", [1])]),
                       "input axes [1]: axis 1 has size 3 (ONNX squeezes only axes of size 1)"),
    "Flatten axis=7": (_file([_node("Flatten", ["X"], axis=7)], X2),
                       "attribute axis 7 is out of range for a rank-2 tensor (ONNX takes -2 to 2)"),
    "Slice axes=[4]": (_file([_node("Slice", ["X", "s", "e", "a"])], X2,
                             [_ints("s", [0]), _ints("e", [1]), _ints("a", [4])]),
                       "input axes [4]: axis 4 is out of range for a rank-2 tensor (ONNX takes -2 to 1)"),
    "Attention scale=0": (_file([_node("Attention", ["Q", "K", "V"], scale=0.0)], None, opset=23, inputs=QKV),
                          "attribute scale 0 is not above 0 (ONNX takes a scale greater than 0)"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_the_command_line_refuses_it_by_node_and_attribute(case, tmp_path, capsys):
    model, says = REFUSED[case]
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    feeds = {i.name: np.zeros([d.dim_value for d in i.type.tensor_type.shape.dim], np.float32)
             for i in model.graph.input}
    assert peers(model, feeds) is None   # ONNX Runtime refuses it too
    assert main(["show", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"blockc: error: {path}: node 'n' ({case.split()[0]}): {says}\n"


@FAST
@given(axis=AXIS, exclusive=st.sampled_from([0, 1]), reverse=st.sampled_from([0, 1]), known=st.booleans())
@example(axis=7, exclusive=0, reverse=0, known=False)
@example(axis=-3, exclusive=1, reverse=1, known=True)
def test_cumsum_axis(axis, exclusive, reverse, known):
    x = _x(known)
    node = helper.make_node("CumSum", ["X", "axis"], ["Y"], exclusive=exclusive, reverse=reverse)
    check(_file([node], x, [_ints("axis", axis)], opset=14), _feeds(x))


def test_cumsum_axis_computed_at_run_time():
    x = _x(False)
    axis = helper.make_tensor_value_info("axis", TensorProto.INT64, [])
    model = _file([helper.make_node("CumSum", ["X", "axis"], ["Y"])], x, opset=14, inputs=[axis])
    ours = blockc_run(model, {"X": x, "axis": np.array(1)})
    assert isinstance(ours, BlockcError)
    assert str(ours).endswith("node 'Y' (CumSum): CumSum's axis is computed at run time (blockc needs it known)")
