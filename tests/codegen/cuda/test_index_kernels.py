"""The kernels of the index and mask arithmetic that imported ONNX graphs
hold (Hugging Face's exports build their causal and padding masks from
ranges, sizes as data, comparisons, logic, casts, expands and gathers of
int64, int32 and bool tensors): generated CUDA, emulated, against the
float64 reference at two sizes of one build (the sizes are symbolic, read
when the kernels run); a gather at computed indices outside its table
failing the run, as on the reference; and the same source compiled by nvcc
for sm_80 and sm_90 with warnings as errors."""
import numpy as np
import pytest

from blockc import BlockcError
from blockc.codegen.cuda import toolchain
from blockc.codegen.cuda.build import write_build
from blockc.codegen.cuda.lower import generate
from blockc.ir.dims import parse_dim
from blockc.ir.dtypes import DType
from blockc.ir.graph import Graph
from blockc.ir.types import TensorType
from blockc.ir.verify import verify
from blockc.runtime.backend import make_backend
from blockc.runtime.reference import run_reference

COMPARE = ("equal", "less", "less_equal", "greater", "greater_equal")
B, S = parse_dim("batch"), parse_dim("seq")
SIZES = ({"batch": 2, "seq": 5}, {"batch": 3, "seq": 8})


def _graph(name, inputs):
    g = Graph(name)
    return g, [g.add_input(n, TensorType(DType.parse(t), tuple(parse_dim(str(d)) for d in shape)))
               for n, t, shape in inputs]


def index_graph():
    """Ranges (of a polynomial dim too), sizes as data, the causal mask from
    two ranges, GPT-2's flat index b*seq + s, int64 arithmetic and where, and
    every comparison on int64, int32 and float32 with broadcasting."""
    g, (m, k, x) = _graph("index", [("m", "i64", ["batch", "seq"]), ("k", "i32", ["batch", "seq"]),
                                    ("x", "f32", ["batch", "seq"])])
    r = g.op("arange", n=S)
    n = g.op("dim_value", value=S)
    lin = g.op("add", g.op("mul", m, n), r)
    off = g.op("sub", lin, g.op("dim_value", value=parse_dim("2*batch*seq+3")))
    out = {"arange": r, "arange_poly": g.op("arange", n=parse_dim("batch*seq+1")), "dim": n,
           "causal": g.op("less_equal", g.op("reshape", r, shape=[1, S]), g.op("reshape", r, shape=[S, 1])),
           "lin": lin, "where": g.op("where", g.op("less", off, lin), off, g.op("neg", off))}
    for t, a, b in (("i64", m, r), ("i32", k, g.op("cast", r, to="int32")), ("f32", x, g.op("cast", r, to="float32"))):
        for op in COMPARE:
            out[f"{op}_{t}"] = g.op(op, a, b)
    return g, out


def logic_graph():
    """And, or, not; casts between int64, int32, bool and float32 (float to
    int truncates); expand of bool, int and float tensors, the result the
    broadcast of both shapes; where on a bool condition."""
    g, (a, b, m, x) = _graph("logic", [("a", "bool", ["batch", 1, "seq"]), ("b", "bool", ["seq"]),
                                       ("m", "i64", ["batch", "seq"]), ("x", "f32", ["batch", 1, "seq"])])
    k = g.op("cast", m, to="int32")
    out = {"and": g.op("logical_and", a, b), "or": g.op("logical_or", b, a), "not": g.op("logical_not", a),
           "to_bool": g.op("cast", m, to="bool"), "to_f32": g.op("cast", a, to="float32"), "to_i32": k,
           "to_i64": g.op("cast", x, to="int64"), "i32_to_i64": g.op("cast", k, to="int64"),
           "expand_bool": g.op("expand", a, shape=[B, 4, S]), "expand_i64": g.op("expand", m, shape=[2, B, S]),
           "expand_i32": g.op("expand", k, shape=[3, 1, 1]), "expand_f32": g.op("expand", x, shape=[1, 3, 1]),
           "where": g.op("where", g.op("logical_not", b), x, g.op("constant", value=np.array(-1e30, np.float32)))}
    return g, out


def gather_graph():
    """dynamo's GatherND of the padding mask: a flat bool table read at
    b*seq + s built by concat and slice of int64 ids, and at the same ids
    made negative (counted from the end); rows of an int64 table; entries
    of a 3-d float table by int32 ids."""
    g, (m, ids, x) = _graph("gather", [("m", "i64", ["batch", "seq"]), ("ids", "i64", ["rows"]),
                                       ("x", "f32", ["batch", "seq", 3])])
    flat = g.op("reshape", g.op("cast", m, to="bool"), shape=[B * S])
    bs = g.op("concat", g.op("expand", g.op("reshape", g.op("arange", n=B), shape=[B, 1, 1]), shape=[B, S, 1]),
              g.op("expand", g.op("reshape", g.op("arange", n=S), shape=[1, S, 1]), shape=[B, S, 1]), axis=-1)
    b_, s_ = (g.op("reshape", g.op("slice", bs, axis=2, start=j, end=j + 1), shape=[B, S]) for j in (0, 1))
    at = g.op("add", g.op("mul", b_, g.op("dim_value", value=S)), s_)
    out = {"ids": bs, "mask": g.op("gather", flat, at, axis=0),
           "mask_neg": g.op("gather", flat, g.op("sub", at, g.op("dim_value", value=B * S)), axis=0),
           "rows_i64": g.op("gather", m, ids, axis=0),
           "entries_f32": g.op("gather", x, g.op("cast", ids, to="int32"), axis=0),
           "mask_t": g.op("transpose", g.op("gather", flat, at, axis=0), perm=[1, 0])}
    return g, out


def _feeds(name, sizes, rng):
    b, s = sizes["batch"], sizes["seq"]
    ints = lambda *shape: rng.integers(-3, 4, size=shape)   # noqa: E731: equal, below and above the ranges
    if name == "index":
        # whole numbers and halves, so that float comparisons meet equal values too
        return {"m": ints(b, s), "k": ints(b, s).astype(np.int32), "x": rng.integers(-4, 16, (b, s)) / 2.0}
    if name == "logic":
        return {"a": rng.random((b, 1, s)) > 0.5, "b": rng.random(s) > 0.5, "m": ints(b, s),
                "x": (rng.standard_normal((b, 1, s)) * 4)}
    return {"m": (rng.random((b, s)) > 0.3).astype(np.int64), "ids": rng.integers(0, b, size=b + 2),
            "x": rng.standard_normal((b, s, 3))}


GRAPHS = {"index": index_graph, "logic": logic_graph, "gather": gather_graph}


@pytest.fixture(scope="module", params=list(GRAPHS))
def case(request):
    g, out = GRAPHS[request.param]()
    g.set_outputs(list(out.items()))
    verify(g)
    return request.param, g


def _typed(graph, feeds):
    return {v.name: np.asarray(feeds[v.name]).astype(v.dtype.numpy) for v in graph.inputs}


def test_index_kernels_match_the_reference(case):
    name, g = case
    backend = make_backend("cuda-emu")
    ok, why = backend.availability()
    if not ok:
        pytest.skip(why)
    # every op runs in a kernel of its own family: none was folded away or decomposed
    ran = {op for step in generate(g, {}).steps for op in step.ops}
    assert {n.op for n in g.nodes} - {"constant", "reshape"} <= ran
    rng = np.random.default_rng(0)
    with backend.compile(g, {}) as compiled:
        for sizes in SIZES:
            feeds = _typed(g, _feeds(name, sizes, rng))
            out, ref = compiled.run(feeds), run_reference(g, {}, feeds)
            for k, want in ref.items():
                assert out[k].dtype == next(v for n, v in g.outputs if n == k).dtype.numpy, k
                if want.dtype.kind == "f":
                    np.testing.assert_allclose(out[k], want, rtol=1e-6, atol=0, err_msg=f"{k} at {sizes}")
                else:
                    np.testing.assert_array_equal(out[k], want, err_msg=f"{k} at {sizes}")


def computed_index_graph():
    """Gathers from a float, an int64 and a bool table, all at indices the
    model computes (k + 1); then an int64 value as large, made after them in
    a buffer of its own (two kernels read it), which a memory plan free to
    reuse the indices' slot would put there."""
    g, (k, x, m, b) = _graph("computed", [("k", "i64", ["seq"]), ("x", "f32", ["rows", 3]), ("m", "i64", ["rows"]),
                                          ("b", "bool", ["rows"])])
    at = g.op("add", k, g.op("constant", value=np.array(1, np.int64)))
    out = {"x": g.op("gather", x, at, axis=0), "m": g.op("gather", m, at, axis=0), "b": g.op("gather", b, at, axis=0)}
    later = g.op("mul", k, k)
    return g, {**out, "later": g.op("neg", later), "later_k": g.op("add", later, k)}


@pytest.mark.parametrize("backend", ["cuda-emu", "cuda"])
@pytest.mark.parametrize("k, first", [([0, 1, 7, 2], "at position 2, is 8"), ([-9, 6, -10, 6], "at position 2, is -9")])
def test_a_computed_index_out_of_range_fails_the_run(backend, k, first):
    """An index the model computes (no check of the feeds sees it) outside
    [-rows, rows) is an error, as the reference's, not a NaN row or a 0:
    blockc_run returns 1, naming the gather and the first bad index, read
    back after every launch from the buffer the gather read."""
    b = make_backend(backend)
    ok, why = b.availability()
    if not ok:
        pytest.skip(why)
    g, out = computed_index_graph()
    g.set_outputs(list(out.items()))
    verify(g)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((8, 3)).astype(np.float32), "m": np.arange(8) * 10,
             "b": np.arange(8) % 3 == 0}
    gathers = [s for s in generate(g, {}).steps if s.ops == ["gather"]]
    assert len(gathers) == 3 and all("first_bad" in s.source for s in gathers)
    with b.compile(g, {}) as compiled:
        bad = {**feeds, "k": np.array(k, np.int64)}
        with pytest.raises(BlockcError, match="gather: index .* is out of range for a dimension of 8"):
            run_reference(g, {}, bad)
        # the float table's gather (%2) is the first to report
        with pytest.raises(BlockcError, match=r"blockc_run in .* returned 1 \(gather %2: computed indices out of "
                                              rf"range \[-8, 8\) \(the first, {first}\)\)"):
            compiled.run(bad)
        good = {**feeds, "k": np.array([-9, 6, 0, -1], np.int64)}   # -8 and 7: the first and last rows
        got, want = compiled.run(good), run_reference(g, {}, good)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name].astype(got[name].dtype), err_msg=name)


NVCC = toolchain.find_nvcc()


@pytest.mark.skipif(NVCC.path is None, reason=f"nvcc tests skipped: {NVCC.reason}")
def test_index_kernels_compile_with_nvcc(case, tmp_path):
    name, g = case
    write_build(generate(g, {}), str(tmp_path))
    result = toolchain.compile_nvcc(tmp_path / "model.cu", ("sm_80", "sm_90"), werror=True,
                                    extra_flags=[f"-I{tmp_path}"])
    assert {k.arch for k in result.kernels} == {"sm_80", "sm_90"}
