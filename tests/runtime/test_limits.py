"""Feeds outside what the graph's tables hold are refused before running, by
one rule (``ops/limits.py``, checked in ``runtime/bindings.input_problems``) on
every backend, and by the generated C API's ``blockc_run`` itself."""
from __future__ import annotations

import numpy as np
import pytest

import blockc
from blockc.ir.dims import evaluate
from blockc.codegen.cuda import toolchain
from blockc.errors import InputsError
from blockc.ops.limits import graph_limits
from blockc.runtime.backend import make_backend

TINY = {"layers": "1"}   # vocab 256, 128 positions
needs_gxx = pytest.mark.skipif(toolchain.find_gxx() is None, reason="g++ not found")


@pytest.fixture(scope="module")
def tiny():
    model = blockc.build_model("tiny", TINY)
    graph = blockc.to_form(blockc.trace(model), "fused")
    return model, graph, dict(blockc.init_weights(model))


def test_limits_come_from_the_graph(tiny):
    model, graph, _ = tiny
    limits = graph_limits(graph)
    assert {k: high for k, (high, _) in limits.ids.items()} == {"input_ids": model.cfg.vocab}
    assert [(str(d.dim), d.limit) for d in limits.dims] == [("seq", model.cfg.max_positions)]
    bert = blockc.trace(blockc.build_model("bert-base", {"layers": "1"}))
    assert {k: high for k, (high, _) in graph_limits(bert).ids.items()} == {"input_ids": 30522, "token_type_ids": 2}


BACKENDS = ["reference", "ort-cpu", pytest.param("cuda-emu", marks=needs_gxx)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [-1, 256, 10**6])
def test_ids_outside_the_vocabulary_are_refused_everywhere(tiny, backend, bad):
    _, graph, weights = tiny
    ids = np.array([[3, bad, 7]], np.int64)
    with pytest.raises(InputsError, match=r"input 'input_ids': 1 of 3 ids out of range \[0, 256\)"):
        make_backend(backend).run(graph, weights, {"input_ids": ids})
    with make_backend(backend).compile(graph, weights) as compiled:   # the path compare and the benches take
        with pytest.raises(InputsError, match=r"ids out of range \[0, 256\)"):
            compiled.run({"input_ids": ids})


@pytest.mark.parametrize("backend", BACKENDS)
def test_positions_outside_the_rotary_tables_are_refused_everywhere(backend):
    # llama-tiny reads its cos/sin tables (128 rows) at the position_ids input: the same rule as token ids
    model = blockc.build_model("llama-tiny", TINY)
    graph = blockc.to_form(blockc.trace(model), "fused")
    assert {k: high for k, (high, _) in graph_limits(graph).ids.items()} == {"input_ids": 256, "position_ids": 128}
    feeds = {"input_ids": np.zeros((1, 3), np.int64), "position_ids": np.array([[0, 1, 128]], np.int64)}
    with pytest.raises(InputsError, match=r"input 'position_ids': 1 of 3 ids out of range \[0, 128\) "
                                          r"\(min 0, max 128; it indexes 'rope.cos', which has 128 rows\)"):
        make_backend(backend).run(graph, dict(blockc.init_weights(model)), feeds)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sequence_longer_than_the_position_table_is_refused_everywhere(tiny, backend):
    _, graph, weights = tiny
    with pytest.raises(InputsError, match=r"dimension 'seq' is 200, over the model's maximum of 128"):
        make_backend(backend).run(graph, weights, {"input_ids": np.zeros((1, 200), np.int64)})


@needs_gxx
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("form", ["standard", "fused"])
def test_a_step_past_a_preallocated_cache_is_refused_everywhere(backend, form):
    # The fused step writes and reads its cache inside one op (cache_attention), with no slice to
    # bound it: the op's own bounds must, in the same words as the unfused graph's.
    model = blockc.build_model("llama-tiny", TINY)
    graph = blockc.to_form(blockc.trace(model.for_cache("decode", cache_len=16)), form)
    assert [(str(d.dim), d.limit) for d in graph_limits(graph).dims] == [("total", 16)]
    total = 20
    feeds = {"input_ids": np.array([[3]], np.int64), "attention_mask": np.ones((1, total), np.int64),
             "position_ids": np.array([[total - 1]], np.int64),
             **{v.name: np.zeros((1, 2, 16, 16), np.float32) for v in graph.inputs if v.name.startswith("past")}}
    with pytest.raises(InputsError, match=r"^dimension 'total' is 20, over the model's maximum of 16 "
                                          r"\('past.0.key' holds 16 positions on axis 2\)$"):
        make_backend(backend).run(graph, dict(blockc.init_weights(model)), feeds)


def test_the_c_api_checks_dims_against_the_model_limits(tiny):
    """blockc_run, called directly (no Python check in front), returns an error
    and a message for seq over the position table instead of reading past it."""
    from blockc.codegen.cuda.build import weights_blob
    from blockc.codegen.cuda.lower import generate
    from blockc.runtime.cuda_runner import CudaRunError, emulated_library, run_emulated
    _, graph, weights = tiny
    model = generate(graph, weights)
    assert "over the model's maximum of 128" in model.source
    so = emulated_library(model)
    image = np.frombuffer(weights_blob(model.params), np.uint8)

    def run(seq):
        dims = {"batch": 1, "seq": seq}
        ids = np.zeros((1, seq), np.int64)
        outs = [np.zeros([evaluate(d, dims) for d in v.shape], v.dtype.numpy) for _, v in model.outputs]
        return run_emulated(so, "blockc_entry", [image, ids, *outs, *[dims[s] for s in model.symbols],
                                                 int(image.nbytes)])

    assert all(np.isfinite(out).all() for out in run(4)[2:])
    with pytest.raises(CudaRunError, match=r"dimension 'seq' is 200, over the model's maximum of 128"):
        run(200)


@pytest.fixture
def c_api_alone(monkeypatch):
    """``run_model`` with the Python check of the limits switched off (the
    checker sees a graph with none), so the feeds reach
    ``blockc_create``/``blockc_run`` and the error is the C API's own, read
    from ``blockc_last_error``."""
    import blockc.runtime.bindings as bindings
    from blockc.ops.limits import Limits
    monkeypatch.setattr(bindings, "graph_limits", lambda graph: Limits({}, []))


@needs_gxx
@pytest.mark.parametrize("ids, first", [([[3, -1, 7, 9]], "at position 1, is -1"),
                                        ([[3, 7, 9, 2], [5, 256, 1, -4]], "at position 5, is 256")])
def test_the_c_api_refuses_ids_outside_the_vocabulary(tiny, c_api_alone, ids, first):
    """blockc_run returns 1 with a message for ids the gather cannot read
    (the first bad one, by position), instead of NaN rows and a 0."""
    from blockc.codegen.cuda.lower import generate
    from blockc.runtime.cuda_runner import CudaRunError, emulated_library, run_model
    _, graph, weights = tiny
    model = generate(graph, weights)
    so = emulated_library(model)
    feeds = {"input_ids": np.array(ids, np.int64)}
    with pytest.raises(CudaRunError, match=r"blockc_run in .* returned 1 \(input 'input_ids': ids out of range "
                                           rf"\[0, 256\) \(the first, {first}; it indexes 'tok.weight', which "
                                           r"has 256 rows\)\)"):
        run_model(model, so, feeds, emulated=True)
    good = {"input_ids": np.where((feeds["input_ids"] < 0) | (feeds["input_ids"] >= 256), 0, feeds["input_ids"])}
    out = run_model(model, so, good, emulated=True).outputs
    ref = blockc.run_reference(graph, weights, good)
    for name in ref:
        np.testing.assert_allclose(out[name], ref[name], rtol=1e-4, atol=1e-5)


@needs_gxx
def test_the_c_api_refuses_positions_outside_the_rotary_tables(c_api_alone):
    from blockc.codegen.cuda.lower import generate
    from blockc.runtime.cuda_runner import CudaRunError, emulated_library, run_model
    model = blockc.build_model("llama-tiny", TINY)
    graph = blockc.to_form(blockc.trace(model), "fused")
    weights = dict(blockc.init_weights(model))
    generated = generate(graph, weights)
    so = emulated_library(generated)
    feeds = {"input_ids": np.zeros((1, 3), np.int64), "position_ids": np.array([[0, 1, 128]], np.int64)}
    with pytest.raises(CudaRunError, match=r"\(input 'position_ids': ids out of range \[0, 128\) \(the first, at "
                                           r"position 2, is 128; it indexes 'rope.cos', which has 128 rows\)\)"):
        run_model(generated, so, feeds, emulated=True)
    feeds["position_ids"][0, 2] = 127   # the last row: read, and right
    out = run_model(generated, so, feeds, emulated=True).outputs
    ref = blockc.run_reference(graph, weights, feeds)
    for name in ref:
        np.testing.assert_allclose(out[name], ref[name], rtol=1e-4, atol=1e-5)


ODD = 'in"put*/\nx'   # a name that must reach the C source escaped


def _two_id_inputs():
    """ids (int64) indexes a 10-row and a 50-row table, the input named
    ``ODD`` (int32) a 4-row one: two flags, one shared by two gathers."""
    from blockc.ir.dims import Sym
    from blockc.ir.dtypes import DType
    from blockc.ir.graph import Graph
    from blockc.ir.types import TensorType
    g = Graph("two_ids")
    n = Sym.var("n")
    ids = g.add_input("ids", TensorType(DType.int64, (n,)))
    other = g.add_input(ODD, TensorType(DType.int32, (n,)))
    tables = {name: g.add_param(name, TensorType(DType.float32, (rows, 8)))
              for name, rows in (("small", 10), ('*/ "t"%s', 4), ("big", 50))}
    y = g.op("add", g.op("add", g.op("gather", tables["small"], ids), g.op("gather", tables['*/ "t"%s'], other)),
             g.op("gather", tables["big"], ids))
    g.set_outputs([("y", y)])
    rng = np.random.default_rng(0)
    weights = {name: rng.standard_normal(v.type.concrete_shape({})).astype(np.float32) for name, v in g.params.items()}
    return g, weights



@needs_gxx
@pytest.mark.parametrize("ids, other, message", [
    ([1, 2, 30, 3], [0, 1, 2, 3], r"input 'ids': ids out of range \[0, 10\) \(the first, at position 2, is 30; "
                                  r"it indexes 'small', which has 10 rows\)"),
    ([1, 2, 3, 4], [0, 1, 2, -7], r"input 'in\"put\*\?\?x': ids out of range \[0, 4\) \(the first, at position 3, "
                                  r"is -7; it indexes '\*\? \"t\"%s', which has 4 rows\)"),
])
def test_the_c_api_checks_every_id_input_against_its_smallest_table(c_api_alone, ids, other, message):
    from blockc.codegen.cuda.lower import generate
    from blockc.runtime.cuda_runner import CudaRunError, emulated_library, run_model
    g, weights = _two_id_inputs()
    assert {k: high for k, (high, _) in graph_limits(g).ids.items()} == {"ids": 10, ODD: 4}
    model = generate(g, weights)
    assert ODD not in model.source and '*/ "t"' not in model.source
    so = emulated_library(model)
    feeds = {"ids": np.array(ids, np.int64), ODD: np.array(other, np.int32)}
    with pytest.raises(CudaRunError, match=r"blockc_run in .* returned 1 \(" + message):
        run_model(model, so, feeds, emulated=True)
    good = {"ids": np.array([9, 0, 5, 1], np.int64), ODD: np.array([3, 0, 2, 1], np.int32)}
    out = run_model(model, so, good, emulated=True).outputs
    np.testing.assert_allclose(out["y"], blockc.run_reference(g, weights, good)["y"], rtol=1e-6)


def test_a_graph_without_id_inputs_pays_nothing_for_the_id_check(tiny):
    """No flags, no read back, no wait on the stream: blockc_run stays asynchronous
    (the one stream synchronize left is BLOCKC_CUDA_CHECK_LAUNCHES's, after each launch)."""
    from blockc.codegen.cuda.lower import generate
    _, graph, weights = tiny
    assert "blockc_check_ids(m, inputs, dims, stream)" in generate(graph, weights).source
    g = blockc.parse_graph("graph g(%x: f32[4,8]) {\n  %0:f32[4,8] = exp %x\n  return y=%0\n}\n")
    source = generate(g, {}).source
    assert "id_errors" not in source and "first_bad" not in source and "blockc_check_ids" not in source
    assert source.count("cudaStreamSynchronize") == 1 and "if (e == cudaSuccess && check) e = cudaStreamSynchronize" \
        in source


# ---- one checker: the first problem a backend raises is the first one a file of inputs lists ----
@pytest.mark.parametrize("feeds", [
    {"input_ids": np.zeros((1, 3), np.int64), "mask": np.zeros(3)},          # a name the graph does not take
    {},                                                                      # a missing input
    {"input_ids": np.zeros((1, 3), np.int32)},                               # a dtype
    {"input_ids": np.zeros((1, 3, 1), np.int64)},                            # a rank
    {"input_ids": np.array([[3, 256, 7]], np.int64)},                        # an id past the table
    {"input_ids": np.zeros((1, 200), np.int64)},                             # seq past the position table
])
def test_a_backend_and_a_file_of_inputs_refuse_a_feed_in_the_same_words(tiny, feeds):
    from blockc.runtime.bindings import bind_inputs
    from blockc.runtime.feeds import check_feeds
    _, graph, _ = tiny
    with pytest.raises(InputsError) as first:
        bind_inputs(graph, feeds)
    with pytest.raises(InputsError) as every:
        check_feeds(graph, feeds)
    assert str(first.value) == first.value.problems[0] == every.value.problems[0]


USER_MODEL = """
import blockc
from blockc.frontends.layers import Embedding, LearnedPositionEmbedding
from blockc.frontends.module import InputSpec
from blockc.ir.dtypes import DType

class M(blockc.Model):
    # declares no limits of its own: its tables set them
    def __init__(self):
        super().__init__()
        self.tok, self.pos = Embedding(10, 8), LearnedPositionEmbedding(16, 8)

    def inputs(self):
        return [InputSpec("ids", DType.int64, (blockc.symbol("batch"), blockc.symbol("seq")), "ids", 10)]

    def forward(self, ids):
        return self.tok(ids) + self.pos(ids.shape[1])
"""


def test_a_user_models_tables_set_its_limits_for_every_command(tmp_path, capsys):
    from blockc.cli import main
    from blockc.runtime.feeds import check_feeds
    path = tmp_path / "m.py"
    path.write_text(USER_MODEL)
    assert main(["fusions", f"{path}:M", "--dim", "seq=32"]) == 2
    assert "--dim seq=32 exceeds the model's maximum of 16" in capsys.readouterr().err
    graph = blockc.trace(blockc.build_model(f"{path}:M"))
    with pytest.raises(InputsError, match=r"dimension 'seq' is 32, over the model's maximum of 16"):
        check_feeds(graph, {"ids": np.zeros((1, 32), np.int64)})
    # a block reads no table, so no seq is too long for it
    block = blockc.trace(blockc.build_model("gpt2-block", {"d_model": "32", "heads": "2"}))
    assert not graph_limits(block) and main(["fusions", "gpt2-block", "--set", "d_model=32", "--set", "heads=2",
                                             "--dim", "seq=4096", "--no-onnx-forms"]) == 0


def test_limits_follow_a_graph_changed_in_place():
    """Graphs are mutable: a table swapped through the graph's API, with the
    same number of nodes and inputs, changes the limit at the next check (a
    cache keyed on those counts once kept the old one)."""
    from blockc.ir.types import TensorType
    from blockc.runtime.bindings import bind_inputs
    graph = blockc.trace(blockc.build_model("tiny", TINY))
    ids = {"input_ids": np.array([[150]], np.int64)}
    assert bind_inputs(graph, ids) == {"batch": 1, "seq": 1}   # inside the 256-row table
    gather = next(n for n in graph.nodes if n.op == "gather" and n.inputs[1].name == "input_ids")
    table = gather.inputs[0]
    counts = (len(graph.nodes), len(graph.inputs))
    graph.set_input(gather, 0, graph.add_param("small.weight", TensorType(table.dtype, (100, table.shape[1]))))
    assert (len(graph.nodes), len(graph.inputs)) == counts
    with pytest.raises(InputsError, match=r"ids out of range \[0, 100\) .*'small.weight', which has 100 rows"):
        bind_inputs(graph, ids)


# A model whose position table is shorter than every command's default seq
# (fusions and compare 128, check and run 16).
SHORT = ["tiny", "--set", "layers=1", "--set", "d_model=32", "--set", "heads=2", "--set", "max_positions=8"]
QUICK_COMPARE = ["--backends", "reference", "--peers", "none", "--no-kernels", "--no-progress", "--blocks", "1",
                 "--rounds", "1", "--repeats", "1", "--warmup", "0", "--min-time", "0"]


@pytest.mark.parametrize("command", [["fusions", *SHORT, "--no-onnx-forms"], ["check", *SHORT],
                                     ["run", *SHORT, "--backend", "reference"], ["compare", *SHORT, *QUICK_COMPARE]])
def test_a_default_dim_is_lowered_to_fit_the_model(command, capsys):
    """A default size is the command's, not the user's: on a model of 8
    positions it becomes 8 and says so; asked for, 9 is still refused."""
    from blockc.cli import main
    assert main(command) == 0
    out, err = capsys.readouterr()
    assert "seq=8, not the default" in out + err and "'pos.weight' has 8 rows" in out + err
    asked = ["--seq", "9"] if command[0] == "compare" else ["--dim", "seq=9"]
    assert main(command + asked) == 2
    assert "seq=9 exceeds" in capsys.readouterr().err


def test_sizes_past_int64_name_the_first_value_that_cannot_exist(tiny):
    """``size_over``: every value of the graph at the bound dims, inputs
    first; the unfused graph's attention scores outgrow int64 long before
    its inputs do, and the fused graph, which never makes them, fits."""
    model, fused, _ = tiny
    standard = blockc.trace(model)
    assert graph_limits(standard).size_over({"batch": 2, "seq": 16}) is None
    over = {"batch": 2**45, "seq": 128}
    said = graph_limits(standard).size_over(over)
    assert said.startswith("the output of matmul (") and said.endswith(   # (the line that traced it)
        f" f32[batch,4,seq,seq] at batch={2**45}, seq=128 is [{2**45}, 4, 128, 128] and has "
        "2.31e+18 elements of 4 bytes, more than any tensor can hold (2**63 bytes)")
    assert graph_limits(fused).size_over(over) is None
    assert graph_limits(standard).size_over({"batch": 2**62, "seq": 2}).startswith("input 'input_ids' i64[batch,seq]")
