"""Importing ONNX files: blockc's own exports and Hugging Face's (torch.onnx,
TorchScript and dynamo exporters) imported, run on the reference interpreter,
fused and re-exported, and compared with ONNX Runtime on the original file
(the outside oracle) at two sequence lengths."""
import functools
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from blockc import BlockcError, optimize
from blockc.cli import main
from blockc.frontends import init_weights, trace
from blockc.frontends.onnx import OnnxModel, load_onnx
from blockc.frontends.weights import materialize
from blockc.ir.parser import parse_graph
from blockc.ir.printer import print_graph
from blockc.runtime.backend import make_backend

from hf_testing import randomise
from ort_sessions import peer_session  # noqa: E402  (tests/: the shared helper)



def _feeds(model, graph, seq, batch=2, seed=0, dims=None):
    sizes = {s: (batch if s.startswith("batch") else seq) for s in graph.symbols()} | (dims(seq) if dims else {})
    rng = np.random.default_rng(seed + seq)
    return {s.name: s.sample(sizes, rng) for s in model.inputs()}


# How blockc runs an imported file, each against ONNX Runtime on the file
# itself: the import as it is, on the float64 reference interpreter; the
# optimized graph re-exported and run by ONNX Runtime; the optimized graph as
# generated CUDA, emulated on the CPU. name: (backend, its options, optimized)
RUNS = {
    "reference": ("reference", {"float64": True}, False),
    "fused-ort": ("ort-cpu", {}, True),
    "fused-cuda-emu": ("cuda-emu", {}, True),
    # the optimized graph on every other backend, and ONNX Runtime with each fused-op encoding
    "fused-reference": ("reference", {"float64": True}, True),
    "fused-torch-eager": ("torch-eager", {}, True),
    **{f"fused-ort-{form}": ("ort-cpu", {"fused_as": form}, True) for form in ("function", "contrib", "onnx23")},
}


def check_against_ort(path, seqs=(5, 11), tol=1e-4, run="reference", dims=None):
    """Import ``path``, run it as ``RUNS[run]`` says at each of ``seqs``
    (one compiled graph: the sizes are symbolic), and compare with ONNX
    Runtime on the file. Every symbol but the batch is the sequence's
    length, or as ``dims(seq)`` says (a past, a total)."""
    name, options, optimized = RUNS[run]
    backend = make_backend(name, **options)
    ok, why = backend.availability()
    if not ok:
        pytest.skip(why)
    model = OnnxModel(path)
    graph = trace(model)
    weights = materialize(init_weights(model))
    session = peer_session(str(path))
    names = [o.name for o in session.get_outputs()]
    with backend.compile(optimize(graph).graph if optimized else graph, weights) as compiled:
        for seq in seqs:
            feeds = _feeds(model, graph, seq, dims=dims)
            ours = compiled.run(feeds)
            theirs = dict(zip(names, session.run(None, feeds)))
            assert set(ours) == set(theirs)
            for k in theirs:
                assert ours[k].shape == theirs[k].shape
                np.testing.assert_allclose(ours[k].astype(np.float64), theirs[k], atol=tol, rtol=tol, err_msg=k)
    return model, graph


BUILTINS = {
    "tiny": [],
    "gpt2-block": ["--set", "d_model=64", "--set", "heads=4"],
    "bert-base": ["--set", "layers=2", "--set", "d_model=64", "--set", "heads=4", "--set", "vocab=100",
                  "--set", "max_positions=64"],
}


@pytest.mark.parametrize("name", list(BUILTINS))
def test_blockc_export_round_trips(name, tmp_path, capsys):
    path = tmp_path / f"{name}.onnx"
    assert main(["export", name, *BUILTINS[name], "-o", str(path)]) == 0
    model, graph = check_against_ort(path)
    assert graph.symbols() == ["batch", "seq"]   # symbolic dims stay symbolic, under their own names
    assert all(not isinstance(d, int) for v in graph.inputs for d in v.shape[:2])
    assert print_graph(parse_graph(print_graph(graph))) == print_graph(graph)


# ---- Hugging Face models exported by torch.onnx ------------------------------
L = 2

# (exporter, model, opset, attention): TorchScript at 17, eager attention; the
# dynamo exporter at its default opset, eager, and at 18 (GELU still written
# with Erf) with Hugging Face's default SDPA attention: a NaN guard after
# softmax, the scale split as √s on q and on k. Every dynamo export reads the
# padding mask with GatherND. Its GPT-2 is the LM (GPT2Model inside).
# TorchScript's SDPA (Optimum's exporter) masks with where(mask, 0, -inf) and a
# NaN guard: tests/frontends/test_onnx_sdpa_mask.py and test_onnx_optimum.py.
# Llama (GQA, RoPE, RMSNorm, SwiGLU) computes its rotary rows from the
# positions: "llama" from arange(seq) inside the graph, "llama-pos" from a
# position_ids input.
EXPORTS = [("torchscript", kind, 17, "eager") for kind in ("gpt2", "gpt2-lm", "bert", "llama")] + \
          [("dynamo", kind, opset, attention) for kind in ("gpt2-lm", "bert")
           for opset, attention in ((None, "eager"), (18, "sdpa"))] + \
          [("dynamo", "llama-pos", None, attention) for attention in ("eager", "sdpa")]

# What each model kind's import fuses (the targets): add+norm after every
# sublayer and at the end, one masked softmax and attention per layer; Llama's
# norms are written out (Pow, ReduceMean, Sqrt...) and recomposed first, its
# queries and keys each rotate once per layer, its K/V repeated per query head
# (repeat_kv) are grouped back once per layer, and SwiGLU's x * sigmoid(x) is
# a silu once per layer.
_GPT = {"add_layernorm": 2 * L + 1, "masked_softmax": L, "attention": L}
_LLAMA = {"rmsnorm": 2 * L + 1, "add_rmsnorm": 2 * L, "masked_softmax": L, "attention": L, "rotary": 2 * L,
          "grouped_attention": L, "silu": L}
FUSED = {"gpt2": _GPT, "gpt2-lm": _GPT, "bert": _GPT, "bert-notype": _GPT, "llama": _LLAMA, "llama-pos": _LLAMA}


def _hf_model(kind, attention, torch, transformers):
    if kind.startswith("bert"):
        cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=L, num_attention_heads=4,
                                      intermediate_size=64, max_position_embeddings=128, attn_implementation=attention)
        return transformers.BertModel(cfg, add_pooling_layer=False)
    if kind.startswith("llama"):
        # GQA (4 query heads over 2 K/V heads); rope_theta off its default so a wrong base shows
        cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=L,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                       rope_theta=500.0, attn_implementation=attention)
        return transformers.LlamaForCausalLM(cfg)
    cfg = transformers.GPT2Config(vocab_size=100, n_positions=128, n_embd=32, n_layer=L, n_head=4,
                                  attn_implementation=attention)
    return (transformers.GPT2LMHeadModel if kind == "gpt2-lm" else transformers.GPT2Model)(cfg)


def _hf_export(exporter, kind, opset, attention, path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    if exporter == "dynamo":
        pytest.importorskip("onnxscript")   # what torch.onnx's dynamo exporter writes ONNX with
    torch.manual_seed(0)
    hf = _hf_model(kind, attention, torch, transformers)
    # Random norms and biases: HF's ones and zeros would hide a wrong mapping, and
    # the dynamo exporter's optimizer merges equal initializers into one.
    randomise(hf, torch)

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = hf

        def forward(self, ids, mask, extra=None):
            if kind.startswith("bert"):
                named = {"token_type_ids": extra}
            else:
                named = {"use_cache": False, **({"position_ids": extra} if extra is not None else {})}
            return self.m(input_ids=ids, attention_mask=mask, return_dict=False, **named)[0]

    third = {"bert": ["token_type_ids"], "llama-pos": ["position_ids"]}.get(kind, [])
    names = ["input_ids", "attention_mask"] + third
    args = tuple(torch.zeros(2, 5, dtype=torch.long) for _ in names)
    dyn = {n: {0: "batch", 1: "sequence"} for n in names}
    options = dict(dynamo=False, opset_version=opset) if exporter == "torchscript" else \
        dict(dynamo=True, verbose=False, **({"opset_version": opset} if opset else {}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Wrapped().eval(), args, str(path), input_names=names, output_names=["out"],
                          dynamic_axes=dyn, **options)
    return path


@pytest.fixture(scope="session")
def hf_export(tmp_path_factory):
    """``hf_export(exporter, kind, opset, attention)``: the exported file, made once per session."""
    @functools.cache
    def get(exporter, kind, opset, attention):
        # named after the family, as a user's file is (compare's peers name it: "gpt2.onnx")
        path = tmp_path_factory.mktemp("hf") / f"{kind.split('-')[0]}.onnx"
        return _hf_export(exporter, kind, opset, attention, path)
    return get


def _export_id(e):
    return f"{e[0]}-{e[1]}-opset{e[2] or 'default'}-{e[3]}"


def _export_group(e):
    """The tests of one export run in one xdist worker, which exports it once."""
    return pytest.mark.xdist_group(f"hf-export-{_export_id(e)}")


@pytest.fixture(scope="module", ids=_export_id, params=[pytest.param(e, marks=_export_group(e)) for e in EXPORTS])
def hf_file(request, hf_export):
    return request.param[1], hf_export(*request.param)


@pytest.mark.parametrize("run", list(RUNS))
def test_hf_export_matches_ort(hf_file, run):
    """The import on the reference, and the optimized graph exported for
    ONNX Runtime and generated as CUDA (emulated), against the original file."""
    kind, path = hf_file
    model, graph = check_against_ort(path, run=run)
    assert graph.symbols() == ["batch", "sequence"]


def test_hf_export_fuses(hf_file):
    """The issue's targets (``FUSED``): 2L+1 add+LayerNorm, and L masked softmaxes
    (causal+padding for GPT-2 and Llama, padding for BERT), which then become
    attention; every GELU is recomposed; Llama's rotations fuse."""
    kind, path = hf_file
    graph = trace(OnnxModel(path))
    result = optimize(graph)
    fused = {}
    for s in result.sites:
        if s.fused:
            fused[s.kind] = fused.get(s.kind, 0) + 1
    assert {k: fused.get(k) for k in FUSED[kind]} == FUSED[kind]
    ops = result.graph.op_counts()
    assert "erf" not in ops and "tanh" not in ops
    if kind.startswith("llama"):
        # as the DSL's llama-tiny: K and V no longer copied per query head (the
        # import expands each per layer; the expands left build the masks),
        # attention over [batch, kv_heads, group, seq, d], SwiGLU's gate through silu
        def kv_copies(g):
            return [n for n in g.nodes if n.op == "expand" and n.outputs[0].dtype.is_float]
        assert len(kv_copies(graph)) == 2 * L and kv_copies(result.graph) == []
        assert [n.inputs[0].type.rank for n in result.graph.nodes if n.op == "attention"] == [5] * L
        assert ops["silu"] == L and "sigmoid" not in ops


def test_hf_bert_without_token_type_ids(tmp_path):
    """A common export: input_ids and attention_mask only. BertModel then reads
    its default token types from a buffer expanded to the batch, with a
    GatherElements at the positions: a gather of a tensor computed at run time.
    (The dynamo exporter writes the same GatherElements.)"""
    path = _hf_export("torchscript", "bert-notype", 17, "eager", tmp_path / "bert.onnx")
    model, graph = check_against_ort(path)
    assert [s.name for s in model.inputs()] == ["input_ids", "attention_mask"]
    result = optimize(graph)
    assert {k: sum(s.fused for s in result.sites if s.kind == k) for k in _GPT} == _GPT


def test_cli_on_an_onnx_file(hf_file, capsys):
    kind, path = hf_file
    assert main(["fusions", str(path), "--dim", "sequence=16"]) == 0
    norm = "add_layernorm" if "add_layernorm" in FUSED[kind] else "add_rmsnorm"
    assert f"{norm:<30}{FUSED[kind][norm]}" in capsys.readouterr().out
    assert main(["run", str(path), "--check", "--dim", "sequence=7"]) == 0
    out = capsys.readouterr().out
    assert "sequence=7" in out and "max |err| vs f64" in out


def test_every_command_on_a_file_with_external_data(tmp_path, capsys):
    """show, summary, check, export and cuda on an imported file whose weights
    are external data (fusions, run and compare: the tests above and below)."""
    sizes = BUILTINS["bert-base"]
    assert main(["export", "bert-base", *sizes, "-o", str(tmp_path / "inline.onnx")]) == 0
    path = tmp_path / "bert.onnx"
    onnx.save(onnx.load(str(tmp_path / "inline.onnx")), str(path), save_as_external_data=True,
              location="bert.onnx.data", size_threshold=256)   # every weight; shapes stay inline for ORT
    (tmp_path / "inline.onnx").unlink()
    assert (tmp_path / "bert.onnx.data").stat().st_size > 100_000 * 4 > path.stat().st_size
    capsys.readouterr()
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith('graph "bert.onnx"(%input_ids: i64[batch,seq]') and "param @tok.weight: f32[100,64]" in out
    assert main(["summary", str(path)]) == 0
    out = capsys.readouterr().out
    assert main(["summary", "bert-base", *sizes]) == 0
    built_in = capsys.readouterr().out.splitlines()
    # the same counts as the built-in model it came from, the lookup tables counted as embeddings
    assert out.splitlines()[-2:] == built_in[-3:-1] and "110,720 parameters" in out
    assert main(["check", str(path), "--dim", "seq=8"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("PASS")
    fused = tmp_path / "fused.onnx"
    assert main(["export", str(path), "--form", "fused", "-o", str(fused)]) == 0
    assert "fused ops as" in capsys.readouterr().out
    feeds = _feeds(OnnxModel(path), trace(OnnxModel(path)), seq=7)
    want, got = (peer_session(str(p)).run(None, feeds)
                 for p in (path, fused))
    np.testing.assert_allclose(got[0], want[0], atol=1e-4, rtol=1e-4)
    build = tmp_path / "cuda"
    assert main(["cuda", str(path), "--no-compile", "--dim", "seq=32", "-o", str(build)]) == 0
    assert "nvcc: not run (--no-compile)" in capsys.readouterr().out
    assert (build / "model.cu").stat().st_size > 0 and (build / "weights.bin").stat().st_size >= 110_720 * 4


def test_load_onnx_gives_graph_and_weights(tmp_path):
    path = tmp_path / "t.onnx"
    assert main(["export", "tiny", "-o", str(path)]) == 0
    graph, weights = load_onnx(path)
    stored = {t.name: onnx.numpy_helper.to_array(t)
              for t in onnx.load(str(path)).graph.initializer}
    assert set(weights) == set(graph.params)
    for name, w in weights.items():
        np.testing.assert_array_equal(w, stored[name])


def test_weights_replace_the_files(tmp_path, capsys):
    """--weights works on an imported model: the parameters are the file's initializers."""
    path = tmp_path / "t.onnx"
    assert main(["export", "gpt2-block", "--set", "d_model=32", "--set", "heads=2", "-o", str(path)]) == 0
    from blockc.frontends.weights import save_weights
    model = OnnxModel(path)
    weights = {k: np.zeros_like(v) for k, v in materialize(init_weights(model)).items()}
    save_weights(tmp_path / "w.npz", weights)
    assert main(["run", str(path), "--weights", str(tmp_path / "w.npz"), "--check"]) == 0


def _file_with(nodes, tmp_path, inputs=None):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph(nodes, "g", inputs or [x], [y])
    # IR version 10: what the installed ONNX Runtime reads (onnx's newest may be past it)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                          ir_version=10)
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    return path


def test_gather_nd_max_min_of_tensors(tmp_path):
    """torch's advanced indexing (GatherND, negative indices too) and
    variadic Max/Min, on tensors computed at run time."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 3])
    const = lambda name, value: helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(value))
    path = _file_with([const("idx", np.array([[0, 1], [1, -1]], np.int64)),
                       const("lo", np.array(0.1, np.float32)), const("hi", np.array([0.5], np.float32)),
                       helper.make_node("GatherND", ["x", "idx"], ["a"]),
                       helper.make_node("Neg", ["a"], ["n"]),
                       helper.make_node("Max", ["a", "lo", "n"], ["m"]),
                       helper.make_node("Min", ["m", "hi"], ["y"])], tmp_path, inputs=[x])
    model, graph = check_against_ort(path)
    assert graph.outputs[0][1].shape == (2, 3)


def test_a_cache_step_positions_and_mask(tmp_path):
    """Optimum's cache step: its positions Range(past, past + seq) from the
    shapes (a start known only as a dim), and its mask named
    ``past_sequence_length + sequence_length``, the sum of two input dims: the
    length of the keys, so that the mask and the scores agree."""
    past = helper.make_tensor_value_info("past", TensorProto.FLOAT, ["batch_size", "past_sequence_length"])
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"])
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                         ["batch_size", "past_sequence_length + sequence_length"])
    one = helper.make_node("Constant", [], ["one"], value=onnx.numpy_helper.from_array(np.array(1, np.int64)))
    path = _file_with([one, helper.make_node("Shape", ["past"], ["ps"]), helper.make_node("Shape", ["input_ids"], ["s"]),
                       helper.make_node("Gather", ["ps", "one"], ["p"], axis=0),
                       helper.make_node("Gather", ["s", "one"], ["n"], axis=0),
                       helper.make_node("Add", ["p", "n"], ["total"]),
                       helper.make_node("Range", ["p", "total", "one"], ["positions"]),
                       helper.make_node("Cast", ["attention_mask"], ["y"], to=TensorProto.FLOAT)],
                      tmp_path, inputs=[past, ids, mask])
    m = onnx.load(str(path))
    m.graph.output.append(helper.make_tensor_value_info("positions", TensorProto.INT64, None))
    onnx.save(m, str(path))
    model, graph = check_against_ort(path, dims=lambda seq: {"past_sequence_length": seq + 3})
    assert graph.symbols() == ["batch_size", "past_sequence_length", "sequence_length"]
    assert str(model.inputs()[2].shape[1]) == "past_sequence_length+sequence_length"


@pytest.mark.parametrize("axis", [-1, 1])
def test_layernorm_without_bias(axis, tmp_path):
    """LayerNormalization's bias is optional: without it, zeros over the
    normalized axes (blockc's layernorm takes one). ONNX Runtime is given
    two inputs, not a "" third: its graph optimizer crashes on that."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 4])
    scale = np.linspace(0.5, 1.5, 4 if axis == -1 else 12, dtype=np.float32).reshape([4] if axis == -1 else [3, 4])
    path = _file_with([helper.make_node("Constant", [], ["g"], value=onnx.numpy_helper.from_array(scale)),
                       helper.make_node("LayerNormalization", ["x", "g"], ["y"], axis=axis)], tmp_path, inputs=[x])
    check_against_ort(path)


def _index_file(tmp_path, op, data_shape, idx_shape, **attrs):
    """``op`` (GatherND or GatherElements) of a float input ``x`` at an int64 input ``idx``."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, data_shape)
    i = helper.make_tensor_value_info("idx", TensorProto.INT64, idx_shape)
    return _file_with([helper.make_node(op, ["x", "idx"], ["y"], **attrs)], tmp_path, inputs=[x, i])


# (op, data shape, index shape, attrs, indices read, indices past their own axis)
INDEXED = [("GatherND", [2, 4, 3], [1, 2], {}, [[1, -4]], [[[0, 4]], [[2, 0]], [[0, -5]]]),
           ("GatherElements", [2, 3], [2, 3], {"axis": 1}, [[0, 2, -1], [1, 1, 0]], [[[0, 3, 0], [0, 0, 0]]])]


@pytest.mark.parametrize("backend", ["reference", "ort-cpu", "torch-eager", "cuda-emu"])
@pytest.mark.parametrize("op, data_shape, idx_shape, attrs, good, bad", INDEXED, ids=[c[0] for c in INDEXED])
def test_an_index_past_its_own_axis_is_refused(op, data_shape, idx_shape, attrs, good, bad, backend, tmp_path):
    """ONNX Runtime refuses an index outside its axis. The import reads
    through one offset into the flattened leading axes, where such an index
    would land on another row: it must be refused there too, on every backend,
    not read the neighbour."""
    b = make_backend(backend)
    ok, why = b.availability()
    if not ok:
        pytest.skip(why)
    path = _index_file(tmp_path, op, data_shape, idx_shape, **attrs)
    session = peer_session(str(path))
    x = np.arange(np.prod(data_shape), dtype=np.float32).reshape(data_shape)
    graph = optimize(trace(OnnxModel(path))).graph
    with b.compile(graph, {}) as compiled:
        feeds = {"x": x, "idx": np.array(good, np.int64)}
        np.testing.assert_array_equal(compiled.run(feeds)["y"], session.run(None, feeds)[0])
        for idx in bad:
            feeds = {"x": x, "idx": np.array(idx, np.int64)}
            with pytest.raises(Exception):
                session.run(None, feeds)   # the outside oracle refuses it...
            with pytest.raises(BlockcError, match="out of (range|bounds|data bounds)"):
                compiled.run(feeds)   # ...and so does blockc (in ONNX Runtime's and torch's words there)


def test_unsupported_ops_listed_at_once(tmp_path):
    path = _file_with([helper.make_node("Loop", ["x"], ["a"]),
                       helper.make_node("FusedMatMul", ["a", "a"], ["b"], domain="com.microsoft"),
                       helper.make_node("Loop", ["b"], ["c"]),
                       helper.make_node("HardSwish", ["c"], ["y"])], tmp_path)
    with pytest.raises(BlockcError) as e:
        OnnxModel(path)
    assert str(e.value) == (f"{path}: 3 operator types not supported by blockc's ONNX import: "
                            "ai.onnx::HardSwish (opset 17), ai.onnx::Loop (opset 17), "
                            "com.microsoft::FusedMatMul (opset 1)")
    assert main(["show", str(path)]) == 2


@pytest.mark.parametrize("node, opset, says", [
    (helper.make_node("Add", ["x", "x"], ["y"], broadcast=1, axis=0), 6, r"Add broadcasting along axis 0 \(opset < 7\)"),
    (helper.make_node("Concat", ["x", "x"], ["y"]), 1, r"Concat without an axis \(opset < 4\)"),
])
def test_old_opset_forms_refused(node, opset, says, tmp_path):
    """An old opset's form that means something else than the rule reads is refused, not misread."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    g = helper.make_graph([node], "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), str(tmp_path / "m.onnx"))
    with pytest.raises(BlockcError, match=says):
        load_onnx(tmp_path / "m.onnx")


def test_set_refused_on_an_onnx_file(tmp_path, capsys):
    path = _file_with([helper.make_node("Relu", ["x"], ["y"])], tmp_path)
    assert main(["show", str(path), "--set", "layers=2"]) == 2
    assert "--set does not apply" in capsys.readouterr().err


# ---- blockc compare on a user's file -----------------------------------------
def _compare(path, **options):
    from blockc.compare import CompareOptions, plan_comparison, run_comparison
    plan = plan_comparison(CompareOptions(model=str(path), backends=("ort-cpu",), peers=("ort-optimizer", "ort-original"),
                                          dims={"sequence": 8}, threads=1, kernels=False, warmup=1, min_repeats=2,
                                          min_time_s=0.0, blocks=1, **options))
    return run_comparison(plan)


GPT2_FILE = ("dynamo", "gpt2-lm", None, "eager")   # one of EXPORTS, so its tests share its worker
assert GPT2_FILE in EXPORTS


@pytest.fixture(scope="module")
def gpt2_file(hf_export):
    # the dynamo exporter's: its weights are external data, which the peers must read in
    return hf_export(*GPT2_FILE)


@_export_group(GPT2_FILE)
def test_compare_runs_the_users_file_beside_blockc(gpt2_file, monkeypatch):
    """The issue's "compare shows blockc's fused graph beside ONNX Runtime's
    optimizer on the same file": blockc's forms, the optimizer applied to the
    user's file (not blockc's re-export: the model it is handed has the
    file's nodes), and the file itself, each within 1e-4 of float64."""
    import json
    from importlib import resources

    import jsonschema
    import onnxruntime.transformers.optimizer as ort_optimizer
    handed = []   # the op types of each model handed to the optimizer (which then rewrites it in place)
    real = ort_optimizer.optimize_model
    monkeypatch.setattr(ort_optimizer, "optimize_model",
                        lambda model, **kw: handed.append([n.op_type for n in model.graph.node]) or real(model, **kw))
    report = _compare(gpt2_file)
    jsonschema.validate(json.loads(json.dumps(report)),
                        json.loads(resources.files("blockc.compare").joinpath("schema.json").read_text()))
    rows = {(r["variant"], r["form"]): r for r in report["results"] if r["backend"] == "ort-cpu"}
    for level in ("basic", "all"):
        for form in ("standard", "fused", "ort-optimizer", "ort-original"):
            r = rows[(level, form)]
            assert r["status"] == "ok" and r["max_abs_error"] <= 1e-4, (level, form, r["error"])
        pairs = {(x["a"], x["b"]) for x in report["ratios"]}
        assert {(f"ort-cpu/{level}/fused", f"ort-cpu/{level}/{p}") for p in ("ort-optimizer", "ort-original")} <= pairs
    assert report["forms"]["fused"]["ops"]["attention"] == L
    file_ops = [n.op_type for n in onnx.load(str(gpt2_file)).graph.node]
    assert handed and all(ops == file_ops for ops in handed)
    peers = {p["name"]: p for p in report["peers"]}
    assert "on the user's file gpt2.onnx" in peers["ort-optimizer"]["detail"]
    assert "num_heads=4, hidden_size=32" in peers["ort-optimizer"]["detail"]   # read from blockc's fused attention
    assert peers["ort-optimizer"]["fused_ops"].get("SkipLayerNormalization") == 2 * L   # its fusions, on the file
    assert peers["ort-original"]["detail"].startswith("the user's file gpt2.onnx as it is,")


@_export_group(GPT2_FILE)
def test_compare_puts_weights_into_the_users_file(gpt2_file, tmp_path):
    """--weights replace the file's initializers in the peers that run the
    file: their outputs match the float64 reference on the new weights, and
    their detail says how many were replaced."""
    from blockc.frontends.weights import save_weights
    model = OnnxModel(gpt2_file)
    weights = {k: (v * 1.25).astype(v.dtype) for k, v in materialize(init_weights(model)).items()}
    save_weights(tmp_path / "w.npz", weights)
    report = _compare(gpt2_file, weights=str(tmp_path / "w.npz"))
    for r in report["results"]:
        assert r["status"] == "ok" and r["max_abs_error"] <= 1e-4, (r["form"], r["error"])
    for p in report["peers"]:
        assert f", {len(weights)} initializers replaced by --weights" in p["detail"]


@_export_group(GPT2_FILE)
def test_own_proto_refuses_weights_that_do_not_fit(gpt2_file):
    model = OnnxModel(gpt2_file)
    name, value = next(iter(materialize(init_weights(model)).items()))
    proto, replaced = model.own_proto()
    assert replaced == 0 and not any(t.external_data for t in proto.graph.initializer)   # read in
    with pytest.raises(BlockcError, match="cannot replace it"):
        model.own_proto({name: value.astype(np.float64)})


def test_a_weightless_export_imports_with_its_weights_given(tmp_path, capsys):
    """``export --no-weights`` writes no ``.data``: the file imports all the
    same, runs with ``--weights`` (as the model it was exported from does with
    those weights) and is summarised; only a run that needs the file's own
    weights is refused, saying where to give them."""
    import blockc
    out, w = tmp_path / "m.onnx", tmp_path / "w.npz"
    settings = ["--set", "layers=1", "--set", "d_model=32", "--set", "heads=2"]
    assert main(["export", "tiny", *settings, "--no-weights", "-o", str(out)]) == 0
    model = blockc.build_model("tiny", {"layers": "1", "d_model": "32", "heads": "2"})
    np.savez(w, **materialize(init_weights(model, seed=5)))
    assert main(["summary", str(out)]) == 0
    ran = {}
    for name, spec in (("file", str(out)), ("model", "tiny")):
        given = [] if name == "file" else settings
        assert main(["run", spec, *given, "--weights", str(w), "--backend", "reference",
                     "--save", str(tmp_path / f"{name}.npz")]) == 0
        ran[name] = np.load(tmp_path / f"{name}.npz")
    for k in ran["model"].files:
        np.testing.assert_array_equal(ran["file"][k], ran["model"][k])
    capsys.readouterr()
    assert main(["run", str(out), "--backend", "reference"]) == 2
    assert "'m.onnx.data' not found beside the model (give the weights with --weights FILE)" in capsys.readouterr().err
