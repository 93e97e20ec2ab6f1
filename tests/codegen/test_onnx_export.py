"""ONNX export: every op exports, passes the full ONNX checker and matches the
float64 reference on ONNX Runtime, at two sets of symbolic dim values."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from blockc.codegen import onnx_export
from blockc.codegen.onnx_export import OPSET_IR_VERSION, export_onnx, save_onnx
from blockc.errors import BlockcError, WeightsError
from blockc.ir.dims import parse_dim
from blockc.ir.dtypes import DType
from blockc.ir.graph import Graph
from blockc.ir.types import TensorType
from blockc.ops import registry
from blockc.runtime.reference import run_reference
from ort_sessions import peer_session  # noqa: E402  (tests/: the shared helper)

F32, F16, I64, BOOL = DType.float32, DType.float16, DType.int64, DType.bool
BINDINGS = [{"batch": 2, "seq": 3, "past": 4}, {"batch": 1, "seq": 6, "past": 0}]
ORT_MAX_IR = 13  # onnxruntime 1.31 refuses IR 14, which onnx 1.23 writes by default


def T(dtype: DType, *shape) -> TensorType:
    return TensorType(dtype, tuple(parse_dim(d) if isinstance(d, str) else d for d in shape))


# -- cases: small graphs, at least one per op ------------------------------------
@dataclass
class Case:
    build: Callable[[], Graph]
    low: float = -2.0       # float feeds and weights are uniform in [low, high)
    high: float = 2.0
    int_high: int = 10      # int feeds are uniform in [0, int_high)
    tol: float = 2e-5


CASES: dict[str, list[Case]] = {}


def case(*ops, **kw):
    def register(fn):
        for op in ops:
            CASES.setdefault(op, []).append(Case(lambda op=op: fn(op), **kw))
        return fn
    return register


@case("add", "sub", "mul")
@case("div", "pow", low=0.5)
def binary(op):
    g = Graph(op)
    x = g.add_input("x", T(F32, "batch", "seq", 8))
    y = g.add_input("y", T(F32, "seq", 1))
    w = g.add_param("w", T(F32, 8))
    g.set_outputs([("out", g.op(op, g.op(op, x, w), y))])
    return g


@case("neg", "exp", "tanh", "erf", "relu", "silu", "sin", "cos", "sigmoid")
@case("sqrt", "reciprocal", low=0.5)
def unary(op):
    g = Graph(op)
    x = g.add_input("x", T(F32, "batch", "seq", 8))
    g.set_outputs([("out", g.op(op, x))])
    return g


@case("where", "causal_mask")
def masked_scores(_):
    g = Graph("masked_scores")
    q = g.add_input("q", T(F32, "batch", "seq", 8))
    k = g.add_input("k", T(F32, "batch", "past+seq", 8))
    g.add_input("pos", T(I64, "batch", "past"))  # only here to give 'past' a source
    scores = g.op("matmul", q, g.op("transpose", k, perm=[0, 2, 1]))
    mask = g.op("causal_mask", rows=parse_dim("seq"), cols=parse_dim("past+seq"))
    neg = g.op("constant", value=np.array(-1e4, np.float32))
    g.set_outputs([("scores", g.op("where", mask, scores, neg)), ("mask", mask)])
    return g


@case("equal", "less", "less_equal", "greater", "greater_equal", "logical_and", "logical_or", int_high=3)
def comparisons(op):
    # ids in [0, 3): equal and unequal pairs both occur
    g = Graph(op)
    a = g.add_input("a", T(I64, "batch", "seq"))
    b = g.add_input("b", T(I64, "seq"))
    if op.startswith("logical_"):
        out = g.op(op, g.op("less", a, b), g.op("equal", a, b))
    else:
        out = g.op(op, a, b)
    g.set_outputs([("out", out)])
    return g


@case("arange", "dim_value", "expand", "logical_not")
def index_mask(_):
    """A padding+causal mask spelled as Hugging Face's exports spell it."""
    g = Graph("index_mask")
    keep = g.add_input("keep", T(I64, "batch", "seq"))
    i = g.op("arange", n=parse_dim("seq"))
    causal = g.op("less_equal", g.op("reshape", i, shape=[1, parse_dim("seq")]),
                  g.op("reshape", i, shape=[parse_dim("seq"), 1]))
    flat = g.op("add", g.op("mul", g.op("reshape", i, shape=[parse_dim("seq"), 1]),
                            g.op("dim_value", value=parse_dim("seq"))), i)
    padded = g.op("logical_not", g.op("equal", keep, g.op("constant", value=np.array(0, np.int64))))
    both = g.op("logical_and", g.op("reshape", padded, shape=[parse_dim("batch"), 1, 1, parse_dim("seq")]), causal)
    g.set_outputs([("mask", g.op("expand", both, shape=[parse_dim("batch"), 2, parse_dim("seq"), parse_dim("seq")])),
                   ("flat", flat)])
    return g


@case("cast", "constant")
def casts(_):
    g = Graph("casts")
    x = g.add_input("x", T(F32, "batch", "seq", 4))
    n = g.add_input("n", T(I64, "seq"))
    scaled = g.op("mul", x, g.op("constant", value=np.array([1.0, 10.0, 100.0, 3.0], np.float32)))
    as_int = g.op("cast", scaled, to="i64")
    back = g.op("cast", g.op("add", n, g.op("constant", value=np.array(7, np.int64))), to="f32")
    flag = g.op("cast", g.op("cast", x, to="bool"), to="f32")
    g.set_outputs([("as_int", as_int), ("back", back), ("flag", flag)])
    return g


@case("reduce_mean", "reduce_sum", "reduce_max")
def reduce(op):
    g = Graph(op)
    x = g.add_input("x", T(F32, "batch", "seq", 8))
    g.set_outputs([("last", g.op(op, x, axes=[-1])),
                   ("over_seq", g.op(op, x, axes=[1], keepdims=False)),
                   ("two", g.op(op, x, axes=[0, 2], keepdims=False))])
    return g


@case("cumsum")
def running_sum(op):
    # every direction ONNX's CumSum has, over a float and an int tensor
    g = Graph(op)
    x = g.add_input("x", T(F32, "batch", "seq", 8))
    ids = g.add_input("ids", T(I64, "batch", "seq"))
    g.set_outputs([("seq", g.op(op, x, axis=1)), ("last", g.op(op, x, axis=-1, exclusive=True)),
                   ("back", g.op(op, x, axis=1, reverse=True)),
                   ("ids_before", g.op(op, ids, axis=-1, exclusive=True, reverse=True))])
    return g


@case("matmul", "transpose")
def attention_matmuls(_):
    g = Graph("attention_matmuls")
    x = g.add_input("x", T(F32, "batch", "seq", 8))
    w = g.add_param("w", T(F32, 8, 8))
    h = g.op("reshape", g.op("matmul", x, w), shape=[0, 0, 2, 4])
    q = g.op("transpose", h, perm=[0, 2, 1, 3])                   # [batch,2,seq,4]
    scores = g.op("matmul", q, g.op("transpose", q, perm=[0, 1, 3, 2]))
    g.set_outputs([("scores", scores)])
    return g


@case("reshape")
def reshapes(_):
    g = Graph("reshapes")
    x = g.add_input("x", T(F32, "batch", "seq", 8))
    b, s = parse_dim("batch"), parse_dim("seq")
    g.set_outputs([
        ("heads", g.op("reshape", x, shape=[0, -1, 2, 4])),
        ("rows", g.op("reshape", x, shape=[b * s, 8])),
        ("split_heads", g.op("reshape", x, shape=[b, s, 4, 2])),
        ("flat", g.op("reshape", x, shape=[-1])),
        ("pairs", g.op("reshape", x, shape=[2 * s * b, -1])),
    ])
    return g


@case("concat", "split", "slice")
def kv_cache(_):
    g = Graph("kv_cache")
    past = g.add_input("past_kv", T(F32, "batch", "past", 8))
    x = g.add_input("x", T(F32, "batch", "seq", 8))
    kv = g.op("concat", past, x, axis=1)
    old, new = g.add_node("split", [kv], {"axis": 1, "sizes": [parse_dim("past"), parse_dim("seq")]}).outputs
    k, v = g.add_node("split", [x], {"axis": -1, "sizes": [3, 5]}).outputs
    p, s = parse_dim("past"), parse_dim("seq")
    g.set_outputs([("kv", kv), ("old", old), ("new", new), ("k", k), ("v", v),
                   ("head", g.op("slice", kv, axis=1, start=0, end=s)),
                   ("tail", g.op("slice", kv, axis=1, start=p, end=p + s)),
                   ("cols", g.op("slice", kv, axis=2, start=2, end=6))])
    return g


@case("cache_write", "cache_attention")
def preallocated_cache(op):
    # A buffer of 12 rows holding `past` of them; the step's rows go after: `seq` of them, one for
    # cache_attention (GroupQueryAttention lowers a one-token step).
    g = Graph(op)
    p, s = parse_dim("past"), (parse_dim("seq") if op == "cache_write" else 1)
    cache_k, cache_v = (g.add_input(n, T(F32, "batch", 2, 12, 8)) for n in ("cache_k", "cache_v"))
    k, v = (g.add_input(n, T(F32, "batch", 2, s, 8)) for n in ("k", "v"))
    g.add_input("pos", T(I64, "past"))  # only here to give 'past' a source
    if op == "cache_write":
        g.set_outputs([("written", g.op(op, cache_k, k, axis=2, start=p))])
        return g
    q = g.add_input("q", T(F32, "batch", 2, 1, 8))
    q_grouped = g.add_input("q_grouped", T(F32, "batch", 2, 3, 1, 8))   # 6 query heads on 2 K/V heads
    plain = g.add_node(op, [q, k, v, cache_k, cache_v], {"scale": 0.5, "causal": True, "start": p}).outputs
    grouped = g.add_node(op, [q_grouped, k, v, cache_k, cache_v], {"scale": 0.5, "causal": True, "start": p})
    # the attention only: rows past past+seq of an unshared present are not the op's (see ops/kv_cache.py)
    g.set_outputs([("out", plain[0]), ("grouped", grouped.outputs[0]),
                   ("written", g.op("slice", plain[1], axis=2, start=0, end=p + s))])
    return g


@case("append_attention")
def appended_cache(op):
    # an exporter's cache step: k, v appended to the past; plain, and grouped (6 query heads on 2 K/V
    # heads) under a guarded key mask
    g = Graph(op)
    k, v = (g.add_input(n, T(F32, "batch", 2, "seq", 8)) for n in ("k", "v"))
    past_k, past_v = (g.add_input(n, T(F32, "batch", 2, "past", 8)) for n in ("past_k", "past_v"))
    q = g.add_input("q", T(F32, "batch", 2, "seq", 8))
    q_grouped = g.add_input("q_grouped", T(F32, "batch", 2, 3, "seq", 8))
    keep = g.add_input("keep", T(BOOL, "batch", 1, 1, 1, "past+seq"))
    plain = g.add_node(op, [q, k, v, past_k, past_v], {"scale": 0.5, "causal": True}).outputs
    grouped = g.add_node(op, [q_grouped, k, v, past_k, past_v, keep],
                         {"scale": 0.5, "causal": True, "mask": "bool", "guarded": True}).outputs
    g.set_outputs([("out", plain[0]), ("present_k", plain[1]), ("present_v", plain[2]), ("grouped", grouped[0])])
    return g


@case("split")
def split_symbolic_input(_):
    # The split input's dim is the expression past+seq: a dim_param of its own.
    g = Graph("split_symbolic_input")
    mask = g.add_input("mask", T(F32, "batch", "past+seq"))
    g.add_input("x", T(F32, "batch", "seq"))
    g.add_input("p", T(F32, "past"))
    a, b = g.add_node("split", [mask], {"axis": 1, "sizes": [parse_dim("past"), parse_dim("seq")]}).outputs
    g.set_outputs([("a", a), ("b", b)])
    return g


@case("gather")
def embedding(_):
    g = Graph("embedding")
    ids = g.add_input("ids", T(I64, "batch", "seq"))
    table = g.add_param("wte", T(F32, 10, 8))
    g.set_outputs([("emb", g.op("gather", table, ids))])
    return g


@case("softmax", "gelu", "layernorm", "rmsnorm")
def norms(op):
    g = Graph(op)
    x = g.add_input("x", T(F32, "batch", "seq", 8))
    if op in ("layernorm", "rmsnorm"):
        params = [g.add_param(f"{op}.g", T(F32, 8))]
        if op == "layernorm":
            params.append(g.add_param(f"{op}.b", T(F32, 8)))
        g.set_outputs([("out", g.op(op, x, *params, eps=1e-5))])
    elif op == "gelu":
        g.set_outputs([("exact", g.op("gelu", x)), ("tanh", g.op("gelu", x, approximate="tanh"))])
    else:
        g.set_outputs([("last", g.op("softmax", x)), ("seq", g.op("softmax", x, axis=1))])
    return g


# Fused ops export in the default form (auto): tests/codegen/test_fused_forms.py tries every form.
@case("masked_softmax", "attention")
def fused_attention(op):
    g = Graph(op)
    q = g.add_input("q", T(F32, "batch", 2, "seq", 4))
    k = g.add_input("k", T(F32, "batch", 2, "past+seq", 4))
    v = g.add_input("v", T(F32, "batch", 2, "past+seq", 4))
    keep = g.add_input("keep", T(BOOL, "batch", 1, 1, "past+seq"))
    bias = g.add_input("bias", T(F32, "seq", "past+seq"))
    g.add_input("pos", T(I64, "past"))  # only here to give 'past' a source
    if op == "attention":
        outs = [("causal", g.op(op, q, k, v, scale=0.5, causal=True)),
                ("bool_mask", g.op(op, q, k, v, keep, mask="bool", fill=-1e4)),
                ("additive", g.op(op, q, k, v, bias, mask="additive", causal=True))]
    else:
        scores = g.op("matmul", q, g.op("transpose", k, perm=[0, 1, 3, 2]))
        outs = [("plain", g.op(op, scores)), ("causal", g.op(op, scores, scale=0.5, causal=True)),
                ("bool_mask", g.op(op, scores, keep, mask="bool", causal=True))]
    g.set_outputs(outs)
    return g


@case("qkv_attention")
def fused_qkv_attention(op):
    g = Graph(op)
    x = g.add_input("x", T(F32, "batch", "seq", 6))
    keep = g.add_input("keep", T(BOOL, "batch", 1, 1, "seq"))
    w, b = g.add_param("w", T(F32, 6, 20)), g.add_param("b", T(F32, 20))
    common = dict(heads=2, sizes=[4, 4, 12], scale=0.5)
    g.set_outputs([("causal", g.op(op, x, w, b, causal=True, **common)),
                   ("padding", g.op(op, x, w, b, keep, mask="bool", **common))])
    return g


@case("rotary", int_high=16)
def fused_rotary(op):
    # The runtime encodings read one angle per pair (blockc/ops/rotary.py): the tables are made
    # so from random halves, as rope_table makes them, rather than random in every column.
    g = Graph(op)
    x = g.add_input("x", T(F32, "batch", 2, "seq", 8))
    pos = g.add_input("pos", T(I64, "batch", "seq"))
    cos, sin = (g.add_param(name, T(F32, 16, 2)) for name in ("cos", "sin"))
    half = [g.op("concat", t, t, axis=-1) for t in (cos, sin)]        # [16, 4]: rotate-half's layout
    pairs = [g.op("reshape", g.op("concat", g.op("reshape", t, shape=[16, 2, 1]), g.op("reshape", t, shape=[16, 2, 1]),
                                  axis=-1), shape=[16, 4]) for t in (cos, sin)]   # each angle twice, side by side
    whole = [g.op("concat", t, t, axis=-1) for t in half]             # [16, 8]: the whole head
    g.set_outputs([("partial", g.op(op, x, *half, pos)), ("interleaved", g.op(op, x, *pairs, pos, interleaved=True)),
                   ("whole", g.op(op, x, *whole, pos))])
    return g


@case("add_layernorm", "add_rmsnorm", "matmul_bias_act")
def fused_block(op):
    g = Graph(op)
    x = g.add_input("x", T(F32, "batch", "seq", 8))
    r = g.add_input("r", T(F32, "batch", "seq", 8))
    gamma = g.add_param("g", T(F32, 8))
    if op == "matmul_bias_act":
        w, b = g.add_param("w", T(F32, 8, 8)), g.add_param("b", T(F32, 8))
        g.set_outputs([(act, g.op(op, x, w, b, activation=act)) for act in ("relu", "gelu", "gelu_tanh")])
        return g
    params = [gamma] + ([g.add_param("b", T(F32, 8))] if op == "add_layernorm" else [])
    y, s = g.add_node(op, [x, r, *params], {"with_sum": True}).outputs
    g.set_outputs([("y", y), ("sum", s), ("y_only", g.op(op, x, r, *params))])
    return g


@case("layernorm", "gelu", "matmul", tol=2e-2)
def block_f16(_):
    g = Graph("block_f16")
    x = g.add_input("x", T(F16, "batch", "seq", 8))
    h = g.op("layernorm", x, g.add_param("ln.g", T(F16, 8)), g.add_param("ln.b", T(F16, 8)))
    h = g.op("gelu", g.op("matmul", h, g.add_param("fc", T(F16, 8, 16))), approximate="tanh")
    h = g.op("rmsnorm", g.op("matmul", h, g.add_param("proj", T(F16, 16, 8))), g.add_param("rms.g", T(F16, 8)))
    g.set_outputs([("out", g.op("add", x, h))])
    return g


@case("all_reduce", "all_gather")
def collective_alone(op):
    # a group of one: ONNX's Identity, which the standard onnxruntime wheel runs (a larger group is
    # com.microsoft AllReduce/AllGather: tests/ops/test_collectives.py, tests/codegen/test_onnx_ranks.py)
    g = Graph(op)
    x = g.add_input("x", T(F32, "batch", "seq", 8))
    g.set_outputs([("y", g.op(op, x, world=1, **({"axis": -1} if op == "all_gather" else {})))])
    return g


ALL_CASES = [(op, i, c) for op, cs in CASES.items() for i, c in enumerate(cs)]


# -- helpers -------------------------------------------------------------------------
def random_array(t: TensorType, bindings, rng, c: Case) -> np.ndarray:
    shape = t.concrete_shape(bindings)
    if t.dtype.is_float:
        return rng.uniform(c.low, c.high, shape).astype(t.dtype.numpy)
    if t.dtype == BOOL:
        return rng.random(shape) < 0.5
    return rng.integers(0, c.int_high, shape).astype(t.dtype.numpy)


def make_weights(g: Graph, rng, c: Case = Case(None)) -> dict:
    return {name: random_array(v.type, {}, rng, c) for name, v in g.params.items()}


def make_feeds(g: Graph, bindings, rng, c: Case = Case(None)) -> dict:
    return {v.name: random_array(v.type, bindings, rng, c) for v in g.inputs}


def ort_session(model: onnx.ModelProto) -> ort.InferenceSession:
    return peer_session(model.SerializeToString())


def ort_run(sess, feeds) -> dict:
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def assert_matches_reference(g, weights, feeds, got, tol):
    ref = run_reference(g, weights, feeds, float64=True)
    assert set(got) == set(ref)
    for name, want in ref.items():
        v = g.output(name)
        assert got[name].dtype == v.dtype.numpy, name
        assert got[name].shape == want.shape, name
        np.testing.assert_allclose(got[name].astype(np.float64), want.astype(np.float64),
                                   rtol=tol, atol=tol, err_msg=name)


def op_types(model) -> list[str]:
    return [n.op_type for n in model.graph.node]


# -- every op --------------------------------------------------------------------------
def test_every_registered_op_has_a_case():
    assert set(registry.OPS) - set(CASES) == set()


@pytest.mark.parametrize("op,i,c", ALL_CASES, ids=[f"{op}-{i}" for op, i, _ in ALL_CASES])
def test_op_exports_and_matches_reference(op, i, c):
    g = c.build()
    assert op in g.op_counts()
    rng = np.random.default_rng(0)
    weights = make_weights(g, rng, c)
    model = export_onnx(g, weights)
    onnx.checker.check_model(model, full_check=True)
    sess = ort_session(model)  # one model for both sets of dim values
    for bindings in BINDINGS:
        feeds = make_feeds(g, bindings, rng, c)
        assert_matches_reference(g, weights, feeds, ort_run(sess, feeds), c.tol)


@pytest.mark.parametrize("opset", sorted(OPSET_IR_VERSION))
def test_every_supported_opset_runs_every_case(opset):
    rng = np.random.default_rng(1)
    for op, i, c in ALL_CASES:
        g = c.build()
        weights = make_weights(g, rng, c)
        model = export_onnx(g, weights, opset=opset)
        assert model.ir_version == OPSET_IR_VERSION[opset] <= ORT_MAX_IR
        assert [(o.domain, o.version) for o in model.opset_import if not o.domain] == [("", opset)]
        # Fused ops may be functions or runtime ops (tests/codegen/test_fused_forms.py), nothing else.
        assert {o.domain for o in model.opset_import} <= {"", "blockc.fused", "com.microsoft"}
        feeds = make_feeds(g, BINDINGS[0], rng, c)
        assert_matches_reference(g, weights, feeds, ort_run(ort_session(model), feeds), c.tol)


# -- structure of the exported model -------------------------------------------------------
def test_ir_version_pin_and_onnxruntime_loads_it():
    g = unary("relu")
    model = export_onnx(g, {})
    assert model.ir_version == OPSET_IR_VERSION[21] == 10
    assert model.opset_import[0].version == 21
    assert OPSET_IR_VERSION[23] == 11
    # Round trip through bytes, as a file would be read.
    ort_session(onnx.load_from_string(model.SerializeToString()))
    for opset, ir in OPSET_IR_VERSION.items():
        assert ir <= ORT_MAX_IR
        assert ir <= onnx.IR_VERSION


def test_unsupported_opset_is_an_error():
    with pytest.raises(BlockcError, match="opset 17"):
        export_onnx(unary("relu"), {}, opset=17)


def test_inputs_and_outputs_carry_symbolic_dims():
    g = split_symbolic_input(None)
    model = export_onnx(g, {})

    def dims(vi):
        return [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]

    ins = {vi.name: dims(vi) for vi in model.graph.input}
    outs = {vi.name: dims(vi) for vi in model.graph.output}
    assert ins == {"mask": ["batch", "past+seq"], "x": ["batch", "seq"], "p": ["past"]}
    assert outs == {"a": ["batch", "past"], "b": ["batch", "seq"]}
    elem = {vi.name: vi.type.tensor_type.elem_type for vi in model.graph.input}
    assert elem["mask"] == onnx.TensorProto.FLOAT


def test_each_symbol_is_read_once_and_expressions_are_cached():
    g = kv_cache(None)
    model = export_onnx(g, {})
    shapes = [n for n in model.graph.node if n.op_type == "Shape"]
    assert len(shapes) == 2  # past and seq, from their first plain input axis
    read = {(n.input[0], {a.name: a.i for a in n.attribute}["start"]) for n in shapes}
    assert read == {("past_kv", 1), ("x", 1)}
    # past+seq is needed twice (slice end, and nowhere else symbolic): one Add.
    assert op_types(model).count("Add") == 1


def test_symbol_without_a_source_is_an_error():
    g = Graph("nosource")
    x = g.add_input("x", T(F32, "past+seq", 4))  # no input axis is plain 'seq'
    g.set_outputs([("y", g.op("slice", x, axis=0, start=0, end=parse_dim("past")))])
    with pytest.raises(BlockcError, match="'past'"):
        export_onnx(g, {})


def test_polynomial_dims_compute_right_values():
    g = Graph("poly")
    x = g.add_input("x", T(F32, "batch", "seq", 2))
    b, s = parse_dim("batch"), parse_dim("seq")
    flat = g.op("reshape", x, shape=[2 * b * s])
    g.set_outputs([("head", g.op("slice", flat, axis=0, start=s - 1, end=2 * b * s - s))])
    model = export_onnx(g, {})
    sess = ort_session(model)
    rng = np.random.default_rng(3)
    for bindings in BINDINGS:
        feeds = make_feeds(g, bindings, rng)
        assert_matches_reference(g, {}, feeds, ort_run(sess, feeds), 0)


def test_rmsnorm_is_decomposed_and_layernorm_is_native():
    g = Graph("norms")
    x = g.add_input("x", T(F32, "batch", "seq", 8))
    h = g.op("layernorm", x, g.add_param("ln.g", T(F32, 8)), g.add_param("ln.b", T(F32, 8)))
    g.set_outputs([("y", g.op("rmsnorm", h, g.add_param("rms.g", T(F32, 8))))])
    model = export_onnx(g, make_weights(g, np.random.default_rng(0)))
    types = op_types(model)
    assert "LayerNormalization" in types and "RMSNormalization" not in types
    assert types.count("ReduceMean") == 1 and "Sqrt" in types
    assert g.op_counts() == {"layernorm": 1, "rmsnorm": 1}  # the caller's graph is untouched


def test_gelu_and_softmax_lower_to_single_onnx_ops():
    assert op_types(export_onnx(norms("gelu"), {})) == ["Gelu", "Gelu"]
    assert op_types(export_onnx(norms("softmax"), {})) == ["Softmax", "Softmax"]


def test_op_with_neither_lowering_nor_decomposition_is_named(monkeypatch):
    monkeypatch.setattr(registry.get("tanh"), "onnx_fn", None)
    g = Graph("g")
    x = g.add_input("x", T(F32, 4))
    g.set_outputs([("y", g.op("tanh", g.op("relu", x)))])
    with pytest.raises(BlockcError, match=r"tanh \(node 1\)"):
        export_onnx(g, {})


def test_op_without_lowering_is_decomposed(monkeypatch):
    monkeypatch.setattr(registry.get("softmax"), "onnx_fn", None)
    g = norms("softmax")
    model = export_onnx(g, {})
    assert "Softmax" not in op_types(model) and "ReduceMax" in op_types(model)
    feeds = make_feeds(g, BINDINGS[0], np.random.default_rng(0))
    assert_matches_reference(g, {}, feeds, ort_run(ort_session(model), feeds), 2e-5)


def test_custom_domain_gets_an_opset_import(monkeypatch):
    monkeypatch.setattr(registry.get("gelu"), "onnx_fn",
                        lambda e, node, ins: [e.emit("Gelu", ins, domain="com.microsoft")])
    g = Graph("g")
    x = g.add_input("x", T(F32, "seq", 4))
    g.set_outputs([("y", g.op("gelu", x))])
    model = export_onnx(g, {})
    assert ("com.microsoft", 1) in [(o.domain, o.version) for o in model.opset_import]
    feeds = make_feeds(g, BINDINGS[0], np.random.default_rng(0))
    assert_matches_reference(g, {}, feeds, ort_run(ort_session(model), feeds), 1e-5)


def test_names_never_collide_with_inputs_params_or_outputs():
    # Labels chosen to look like the names the emitter makes.
    g = Graph("names")
    x = g.add_input("const_1", T(F32, "seq", 4))
    w = g.add_param("n0.add.Add_2", T(F32, 4))
    c = g.op("constant", value=np.ones(4, np.float32))
    h = g.op("add", g.op("add", x, w), c)
    g.set_outputs([("const_3", h), ("n1.add.Add_4", g.op("mul", h, c))])
    weights = make_weights(g, np.random.default_rng(0))
    model = export_onnx(g, weights)
    produced = [o for n in model.graph.node for o in n.output]
    inits = [t.name for t in model.graph.initializer]
    all_names = produced + inits + [vi.name for vi in model.graph.input]
    assert len(all_names) == len(set(all_names))
    assert sorted(inits[:1]) == ["n0.add.Add_2"]
    feeds = make_feeds(g, BINDINGS[0], np.random.default_rng(1))
    assert_matches_reference(g, weights, feeds, ort_run(ort_session(model), feeds), 1e-6)


def test_outputs_that_are_inputs_params_constants_or_repeats():
    g = Graph("passthrough")
    x = g.add_input("x", T(F32, "seq", 4))
    w = g.add_param("w", T(F32, 4))
    c = g.op("constant", value=np.arange(4, dtype=np.float32))
    y = g.op("add", x, w)
    g.set_outputs([("x", x), ("x_again", x), ("w_out", w), ("c", c), ("y", y), ("y2", y)])
    weights = make_weights(g, np.random.default_rng(0))
    model = export_onnx(g, weights)
    assert [vi.name for vi in model.graph.output] == ["x", "x_again", "w_out", "c", "y", "y2"]
    assert op_types(model).count("Identity") == 4  # x_again, w_out, c, y2; y is renamed in place
    feeds = make_feeds(g, BINDINGS[0], np.random.default_rng(1))
    assert_matches_reference(g, weights, feeds, ort_run(ort_session(model), feeds),1e-6)


def test_output_named_like_another_input_is_an_error():
    g = Graph("clash")
    x = g.add_input("x", T(F32, 4))
    g.add_input("y", T(F32, 4))
    g.set_outputs([("y", g.op("relu", x))])
    with pytest.raises(BlockcError, match="'y'"):
        export_onnx(g, {})


def test_identical_constants_are_stored_once():
    g = Graph("consts")
    x = g.add_input("x", T(F32, "seq", 8))
    y = g.op("reduce_sum", g.op("reduce_mean", x, axes=[-1]), axes=[-1])
    y = g.op("add", y, g.op("constant", value=np.array(2.0, np.float32)))
    y = g.op("mul", y, g.op("constant", value=np.array(2.0, np.float32)))
    g.set_outputs([("y", y)])
    model = export_onnx(g, {})
    values = [(t.data_type, tuple(t.dims), t.raw_data) for t in model.graph.initializer]
    assert len(values) == len(set(values)) == 2  # axes [-1] and the scalar 2.0


# -- dtypes and weights ------------------------------------------------------------------
def test_dtypes_map_to_onnx_codes():
    g = Graph("dtypes")
    outs = []
    for dtype in (DType.float32, DType.float16, DType.bfloat16, DType.float64, DType.int64, DType.int32, BOOL):
        p = g.add_param(f"w_{dtype.short}", T(dtype, 2, 3))
        outs.append((f"y_{dtype.short}", g.op("transpose", p, perm=[1, 0])))
        g.add_input(f"x_{dtype.short}", T(dtype, "seq"))
    g.set_outputs(outs)
    weights = make_weights(g, np.random.default_rng(0))
    model = export_onnx(g, weights)
    for t in model.graph.initializer:
        dtype = g.params[t.name].dtype
        assert t.data_type == dtype.onnx_code == onnx.helper.np_dtype_to_tensor_dtype(dtype.numpy)
        back = onnx.numpy_helper.to_array(t)
        assert back.dtype == dtype.numpy and np.array_equal(back.astype(np.float64),
                                                            weights[t.name].astype(np.float64))
    for vi in model.graph.input:
        assert vi.type.tensor_type.elem_type == DType.parse(vi.name[2:]).onnx_code


def test_bfloat16_weights_are_stored_exactly():
    w = np.array([[1.5, -2.25, 3e-3]], dtype=ml_dtypes.bfloat16)
    g = Graph("bf16")
    g.set_outputs([("y", g.op("reshape", g.add_param("w", T(DType.bfloat16, 1, 3)), shape=[3]))])
    model = export_onnx(g, {"w": w})
    (t,) = [t for t in model.graph.initializer if t.name == "w"]
    assert t.data_type == onnx.TensorProto.BFLOAT16
    assert onnx.numpy_helper.to_array(t).view(np.uint16).tolist() == w.view(np.uint16).tolist()


def test_every_weight_problem_is_listed_at_once():
    g = Graph("w")
    x = g.add_input("x", T(F32, 4))
    for name in ("a", "b", "c", "d"):
        x = g.op("add", x, g.add_param(name, T(F32, 4)))
    g.set_outputs([("y", x)])
    weights = {"a": np.zeros(4, np.float32), "b": np.zeros(5, np.float32), "c": np.zeros(4, np.float64)}
    with pytest.raises(WeightsError) as info:
        export_onnx(g, weights)
    text = str(info.value)
    assert "3 weight(s)" in text and "b:" in text and "c:" in text and "d: missing" in text
    assert "a:" not in text


def test_lazy_weights_are_read_once():
    class Lazy(dict):
        reads: dict = {}

        def __getitem__(self, key):
            self.reads[key] = self.reads.get(key, 0) + 1
            return np.full(4, 0.5, np.float32)

    g = Graph("lazy")
    x = g.add_input("x", T(F32, 4))
    g.set_outputs([("y", g.op("mul", g.op("add", x, g.add_param("a", T(F32, 4))), g.add_param("b", T(F32, 4))))])
    lazy = Lazy(a=None, b=None)
    export_onnx(g, lazy)
    assert lazy.reads == {"a": 1, "b": 1}


# -- checker -------------------------------------------------------------------------------
def test_checker_failure_is_a_blockc_error(monkeypatch):
    # A lowering that declares the wrong result shape: full_check's inference catches it.
    monkeypatch.setattr(registry.get("transpose"), "onnx_fn",
                        lambda e, node, ins: [e.emit("Transpose", ins, perm=[0, 1])])
    g = Graph("bad")
    x = g.add_input("x", T(F32, 2, 3))
    g.set_outputs([("y", g.op("transpose", x, perm=[1, 0]))])
    with pytest.raises(BlockcError, match="checker"):
        export_onnx(g, {})


def test_large_models_are_checked_without_their_weights(monkeypatch):
    checked = []
    real = onnx.checker.check_model
    monkeypatch.setattr(onnx.checker, "check_model",
                        lambda m, full_check=False: (checked.append(m), real(m, full_check=full_check)))
    g = matmul_32()
    weights = make_weights(g, np.random.default_rng(0))
    model = export_onnx(g, weights, external_threshold=100)
    (light,) = checked
    assert [t.name for t in light.graph.initializer] == []
    assert "w" in [vi.name for vi in light.graph.input]
    assert [t.name for t in model.graph.initializer] == ["w"]  # the returned model keeps them
    with pytest.raises(BlockcError, match="external_data"):
        export_onnx(g, weights, external_data=False, external_threshold=100)


# -- saving -----------------------------------------------------------------------------------
def matmul_32():
    g = Graph("matmul_32")
    x = g.add_input("x", T(F32, "seq", 32))
    w = g.add_param("w", T(F32, 32, 32))  # 4 KiB: over onnx's 1 KiB external-data cut
    g.set_outputs([("y", g.op("matmul", x, w))])
    return g


def _saved_case():
    g = attention_matmuls(None)
    return g, make_weights(g, np.random.default_rng(0), Case(None))


def _run_file(path, g, weights):
    sess = peer_session(str(path))
    feeds = make_feeds(g, BINDINGS[1], np.random.default_rng(2))
    assert_matches_reference(g, weights, feeds, ort_run(sess, feeds), 2e-5)


def test_save_inline(tmp_path):
    g, weights = _saved_case()
    path = tmp_path / "m.onnx"
    save_onnx(g, weights, path)
    assert sorted(os.listdir(tmp_path)) == ["m.onnx"]
    onnx.checker.check_model(str(path), full_check=True)
    _run_file(path, g, weights)


@pytest.mark.parametrize("how", [{"external_threshold": 64}, {"external_data": True}])
def test_save_with_external_data(tmp_path, how):
    g = matmul_32()
    weights = make_weights(g, np.random.default_rng(0))
    path = tmp_path / "m.onnx"
    save_onnx(g, weights, path, **how)
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.data"]
    assert os.path.getsize(tmp_path / "m.onnx.data") >= 32 * 32 * 4
    assert os.path.getsize(path) < 1024
    proto = onnx.load(str(path), load_external_data=False)
    (t,) = [t for t in proto.graph.initializer if t.name == "w"]
    assert t.data_location == onnx.TensorProto.EXTERNAL
    assert {e.key: e.value for e in t.external_data}["location"] == "m.onnx.data"
    onnx.checker.check_model(str(path), full_check=True)
    _run_file(path, g, weights)


def test_save_failure_leaves_nothing(tmp_path, monkeypatch):
    g, weights = _saved_case()

    def broken_save(model, f, **kw):
        with open(f, "wb") as fh:
            fh.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(onnx_export.onnx, "save_model", broken_save)
    for external in (False, True):
        with pytest.raises(BlockcError, match="disk full"):
            save_onnx(g, weights, tmp_path / "m.onnx", external_data=external)
        assert os.listdir(tmp_path) == []


def test_save_failure_keeps_the_previous_file(tmp_path, monkeypatch):
    g, weights = _saved_case()
    path = tmp_path / "m.onnx"
    path.write_bytes(b"old model")
    monkeypatch.setattr(onnx_export.os, "replace", lambda a, b: (_ for _ in ()).throw(OSError("rename failed")))
    with pytest.raises(BlockcError, match="rename failed"):
        save_onnx(g, weights, path)
    assert os.listdir(tmp_path) == ["m.onnx"] and path.read_bytes() == b"old model"


def test_export_errors_write_nothing(tmp_path, monkeypatch):
    g, weights = _saved_case()
    with pytest.raises(WeightsError):
        save_onnx(g, {}, tmp_path / "m.onnx")
    monkeypatch.setattr(onnx_export, "check_model", lambda *a, **k: (_ for _ in ()).throw(BlockcError("bad")))
    with pytest.raises(BlockcError, match="bad"):
        save_onnx(g, weights, tmp_path / "m.onnx")
    assert os.listdir(tmp_path) == []


def test_save_into_missing_folder_is_an_error(tmp_path):
    g, weights = _saved_case()
    with pytest.raises(BlockcError, match="does not exist"):
        save_onnx(g, weights, tmp_path / "nope" / "m.onnx")


@pytest.mark.parametrize("how", [{}, {"external_data": True}, {"weights": None}])
def test_what_the_export_decided_is_returned(tmp_path, how):
    """The form each fused node was written in comes back as a value, from
    the export and from every way of saving one; and from an ONNX Runtime
    session, which exports for the provider it runs on."""
    from blockc.codegen.onnx_export import export_onnx_decided
    from blockc.runtime.ort_runner import OrtSession
    g = fused_block("add_layernorm")
    weights = make_weights(g, np.random.default_rng(0))
    model, decisions = export_onnx_decided(g, weights, fused_as="function")
    assert [d["op"] for d in decisions] == ["add_layernorm"] * 2 and {d["form"] for d in decisions} == {"function"}
    assert op_types(model) == op_types(export_onnx(g, weights, fused_as="function"))
    saved = save_onnx(g, how.get("weights", weights), tmp_path / "m.onnx", fused_as="function",
                      **{k: v for k, v in how.items() if k != "weights"})
    assert saved == decisions
    with OrtSession(g, weights, fused_as="function", decide=True) as session:
        assert session.decisions == decisions
