"""Importing files whose graph calls model-local functions
(``ModelProto.functions``): blockc's own ``--fused-as function`` exports,
TorchScript's ``export_modules_as_functions``, onnxscript's and hand-built
ones, each compared with ONNX Runtime on the file (the outside oracle) at two
sequence lengths. Hostile files (recursion, calls that multiply) are in
test_onnx_hostile.py."""
import warnings

import numpy as np
import onnx
import pytest
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from blockc import BlockcError, optimize
from blockc.cli import main
from blockc.frontends import trace
from blockc.frontends.onnx import OnnxModel
from blockc.ir.parser import parse_graph
from blockc.ir.printer import print_graph
from blockc.runtime.backend import make_backend

from test_onnx_import import BUILTINS, check_against_ort
from ort_sessions import peer_session  # noqa: E402  (tests/: the shared helper)


LOCAL = "local"


def _fused(graph) -> tuple[dict, dict]:
    """What ``optimize`` fuses in ``graph`` (kind -> sites), and the op counts it leaves."""
    result = optimize(graph)
    fused = {}
    for s in result.sites:
        if s.fused:
            fused[s.kind] = fused.get(s.kind, 0) + 1
    return fused, result.graph.op_counts()


# ---- blockc's own exports ------------------------------------------------------
@pytest.mark.parametrize("name", ["gpt2-block", "bert-base"])
def test_blockc_function_export_imports_and_fuses_again(name, tmp_path):
    """``--fused-as function`` writes each fused op as a call of a local
    function whose body is its decomposition: imported, the bodies inlined
    match ONNX Runtime, and the fusions find the same fused ops, in the same
    graph, as in the standard export's import."""
    path, plain = tmp_path / "function.onnx", tmp_path / "standard.onnx"
    assert main(["export", name, *BUILTINS[name], "--fused-as", "function", "-o", str(path)]) == 0
    assert main(["export", name, *BUILTINS[name], "-o", str(plain)]) == 0
    calls = [n for n in onnx.load(str(path)).graph.node if n.domain == "blockc.fused"]
    assert len(calls) >= 3 and not any(n.domain == "blockc.fused" for n in OnnxModel(path).nodes)
    model, graph = check_against_ort(path)
    assert graph.symbols() == ["batch", "seq"]
    assert print_graph(parse_graph(print_graph(graph))) == print_graph(graph)
    fused, ops = _fused(graph)
    fused_plain, ops_plain = _fused(trace(OnnxModel(plain)))
    # the function form's graph packs Q, K and V (a Concat of their weights before
    # the call): what the standard form's `qkv` fusion does is already done there
    assert fused == {k: v for k, v in fused_plain.items() if k != "qkv"}
    assert ops == ops_plain and ops["qkv_attention"] >= 1 and ops["add_layernorm"] >= 1


def test_blockc_function_export_re_exports(tmp_path):
    """The inlined graph, optimized and exported again (each body's values
    renamed apart), runs on ONNX Runtime and matches the file."""
    path = tmp_path / "function.onnx"
    assert main(["export", "gpt2-block", *BUILTINS["gpt2-block"], "--fused-as", "function", "-o", str(path)]) == 0
    check_against_ort(path, run="fused-ort")


# ---- hand-built files ------------------------------------------------------------
def _function(name, inputs, outputs, nodes, opset=17, attributes=(), defaults=(), imports=()):
    return helper.make_function(LOCAL, name, inputs, outputs, nodes,
                                [helper.make_opsetid("", opset), *[helper.make_opsetid(d, 1) for d in imports]],
                                attributes=list(attributes), attribute_protos=list(defaults))


def _ref(name, kind, refers_to=None):
    """An attribute of a body node that takes the function's attribute ``refers_to``
    (by hand: older onnx releases' make_attribute_ref takes no ref_attr_name)."""
    a = AttributeProto()
    a.name, a.type, a.ref_attr_name = name, kind, refers_to or name
    return a


def _node(op, ins, outs, *refs, domain="", **attrs):
    n = helper.make_node(op, ins, outs, domain=domain, **attrs)
    n.attribute.extend(refs)
    return n


def _model_file(tmp_path, nodes, functions, inputs, outputs, opset=17, initializers=(), name="f.onnx"):
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                               for o in outputs], list(initializers))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(LOCAL, 1)],
                          functions=functions, ir_version=10)   # what the installed ONNX Runtime reads
    path = tmp_path / name
    onnx.save(m, str(path))
    return path


def _x(name="x", shape=("batch", 4, "seq")):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


# ScaledSoftmax(X) {axis = -1, scale}: softmax(X * scale, axis), its body written
# at opset 13 (Softmax-13 is the operator the model's opset 17 names too).
SCALED_SOFTMAX = _function(
    "ScaledSoftmax", ["X"], ["Y"],
    [_node("Constant", [], ["s"], _ref("value_float", AttributeProto.FLOAT, "scale")),
     _node("Mul", ["X", "s"], ["t"]),
     _node("Softmax", ["t"], ["Y"], _ref("axis", AttributeProto.INT))],
    opset=13, attributes=["scale"], defaults=[helper.make_attribute("axis", -1)])


def test_attribute_references_and_the_functions_opset(tmp_path):
    """An attribute reference takes the call's attribute, else the
    function's default; a body written at another opset than the model is
    read at its own; two calls of one function keep their values apart."""
    path = _model_file(tmp_path, [
        helper.make_node("ScaledSoftmax", ["x"], ["a"], domain=LOCAL, scale=0.5, axis=1),
        helper.make_node("ScaledSoftmax", ["a"], ["y"], domain=LOCAL, scale=3.0),   # axis: the default, -1
    ], [SCALED_SOFTMAX], [_x()], ["y"])
    model, graph = check_against_ort(path)
    nodes = model.nodes
    assert [(n.op_type, n.opset) for n in nodes if n.op_type == "Softmax"] == [("Softmax", 13)] * 2
    assert len({o for n in nodes for o in n.output}) == sum(len(n.output) for n in nodes) == 6
    assert graph.op_counts()["softmax"] == 2 and graph.op_counts()["transpose"] == 2   # axis 1 is not last


def test_the_body_is_read_at_its_own_opset(tmp_path):
    """A body at opset 13 takes ReduceMean's axes as an attribute, which
    opset 18 moved to an input. ONNX Runtime reads bodies at the model's
    opset and refuses this file; ONNX's reference evaluator reads it as ONNX
    says (the function's opset_import), and blockc agrees with it."""
    center = _function("Center", ["X"], ["Y"], [_node("ReduceMean", ["X"], ["m"], axes=[-1]),
                                                 _node("Sub", ["X", "m"], ["Y"])], opset=13)
    path = _model_file(tmp_path, [helper.make_node("Center", ["x"], ["y"], domain=LOCAL)], [center],
                       [_x()], ["y"], opset=18)
    with pytest.raises(Exception, match="axes"):
        peer_session(str(path))
    from onnx.reference import ReferenceEvaluator
    x = np.random.default_rng(0).standard_normal((2, 4, 3)).astype(np.float32)
    want = ReferenceEvaluator(str(path)).run(None, {"x": x})[0]
    got = make_backend("reference").run(trace(OnnxModel(path)), {}, {"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_nested_functions_optional_inputs_and_outputs(tmp_path):
    """Outer calls Inner twice and passes its own attribute down to it by
    reference; Inner's bias input is optional and one call leaves it out
    (""), the other gives fewer inputs than Inner takes; one call leaves out
    Inner's second output. Outer is called twice, once where the graph
    already holds a value of the name its first value would get."""
    inner = _function("Inner", ["X", "W", "C"], ["Y", "Z"],
                      [_node("Gemm", ["X", "W", "C"], ["Y"], _ref("alpha", AttributeProto.FLOAT), transB=1),
                       _node("Tanh", ["Y"], ["Z"])],
                      attributes=["alpha"], defaults=[helper.make_attribute("alpha", 0.5)])
    outer = _function("Outer", ["X", "W", "C"], ["Y"],
                      [_node("Inner", ["X", "W", ""], ["n1", ""], _ref("alpha", AttributeProto.FLOAT, "scale"),
                             domain=LOCAL),
                       _node("Inner", ["n1", "W"], ["n2", "t"], domain=LOCAL),   # alpha: Inner's default
                       _node("Add", ["n2", "t"], ["s"]),
                       _node("Add", ["s", "C"], ["Y"])],
                      attributes=["scale"], imports=[LOCAL])
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32), "w")
    c = numpy_helper.from_array(np.linspace(-0.2, 0.2, 4, dtype=np.float32), "c")
    path = _model_file(tmp_path, [
        helper.make_node("Neg", ["x"], ["block/n1"]),
        helper.make_node("Outer", ["block/n1", "w", "c"], ["h"], domain=LOCAL, name="block", scale=0.25),
        helper.make_node("Outer", ["h", "w", "c"], ["y"], domain=LOCAL, scale=2.0),
    ], [outer, inner], [_x(shape=("seq", 4))], ["y"], initializers=[w, c])
    model, graph = check_against_ort(path)
    names = [o for n in model.nodes for o in n.output]
    assert len(names) == len(set(names)) and {"block/n1~2", "y/n1"} <= set(names)
    gemms = [n for n in model.nodes if n.op_type == "Gemm"]
    assert sorted(n.attrs["alpha"].f for n in gemms) == [0.25, 0.5, 0.5, 2.0]
    assert [n.input[2] for n in gemms] == [""] * 4
    assert [n.op_type for n in model.nodes].count("Tanh") == 4   # computed, though one of each two is not read


def test_an_output_that_is_an_input(tmp_path):
    """A function may give its input back as an output (ONNX Runtime's
    function schemas refuse that; ONNX's reference evaluator runs it): the
    call's output is an Identity of what it passed in."""
    both = _function("Both", ["X"], ["Y", "X"], [_node("Relu", ["X"], ["Y"])])
    path = _model_file(tmp_path, [helper.make_node("Both", ["x"], ["a", "b"], domain=LOCAL),
                                  helper.make_node("Sub", ["a", "b"], ["y"])], [both], [_x()], ["y"])
    from onnx.reference import ReferenceEvaluator
    x = np.random.default_rng(0).standard_normal((2, 4, 3)).astype(np.float32)
    model = OnnxModel(path)
    assert [(n.op_type, n.input, n.output) for n in model.nodes][-2:] == [("Identity", ("x",), ("b",)),
                                                                        ("Sub", ("a", "b"), ("y",))]
    got = make_backend("reference").run(trace(model), {}, {"x": x})["y"]
    np.testing.assert_array_equal(got, ReferenceEvaluator(str(path)).run(None, {"x": x})[0])


def test_unknown_functions_are_listed_with_the_unsupported_operators(tmp_path):
    """A call of a function the file does not define, in the graph or in a
    body, is an operator the importer lacks: listed in the one error, each at
    the opsets it is read at (a body's own)."""
    body = _function("Known", ["X"], ["Y"], [_node("Missing", ["X"], ["h"], domain="mylib"),
                                             _node("HardSwish", ["h"], ["Y"])], opset=14, imports=["mylib"])
    path = _model_file(tmp_path, [helper.make_node("Known", ["x"], ["a"], domain=LOCAL),
                                  helper.make_node("Nope", ["a"], ["y"], domain=LOCAL, overload="v2")],
                       [body], [_x()], ["y"])
    with pytest.raises(BlockcError) as e:
        OnnxModel(path)
    assert str(e.value) == (f"{path}: 3 operator types not supported by blockc's ONNX import: "
                            "ai.onnx::HardSwish (opset 14), local::Nope (opset 1), mylib::Missing (opset 1)")


# ---- functions other writers keep ----------------------------------------------------
def test_onnxscript_functions_with_attribute_defaults(tmp_path):
    """onnxscript writes a function's default attributes as ``attribute_proto``,
    and a call of another of its functions inside one."""
    pytest.importorskip("onnxscript")
    from onnxscript import opset18 as op
    from onnxscript import script
    from onnxscript.values import Opset
    this = Opset(LOCAL, 1)

    @script(this, default_opset=op)
    def Scale(x, s: float = 2.0):
        return op.Mul(x, op.Constant(value_float=s))

    @script(this, default_opset=op)
    def Block(x):
        return Scale(op.Relu(x), s=3.0) + Scale(op.Tanh(x))

    functions = [Block.to_function_proto(), Scale.to_function_proto()]
    assert [list(f.attribute_proto) for f in functions] == [[], [helper.make_attribute("s", 2.0)]]
    path = _model_file(tmp_path, [helper.make_node("Block", ["x"], ["a"], domain=LOCAL),
                                  helper.make_node("Neg", ["x"], ["n"]),
                                  helper.make_node("Block", ["n"], ["b"], domain=LOCAL),
                                  helper.make_node("Add", ["a", "b"], ["y"])], functions, [_x()], ["y"], opset=18)
    check_against_ort(path)


@pytest.fixture(scope="module")
def torchscript_files(tmp_path_factory):
    """A two-block transformer-ish torch model exported by TorchScript with its
    blocks, MLPs and LayerNorms as local functions (nested: a block calls the
    other two), and without. The two LayerNorms' epsilons differ, so the
    LayerNorm function refers to its epsilon as an attribute; the block's
    calls do not give it, so the body's LayerNormalization takes its default
    (in ONNX Runtime as in blockc)."""
    torch = pytest.importorskip("torch")

    class MLP(torch.nn.Module):
        def __init__(self, d):
            super().__init__()
            self.fc, self.proj = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

        def forward(self, x):
            return self.proj(torch.nn.functional.gelu(self.fc(x), approximate="tanh"))

    class Block(torch.nn.Module):
        def __init__(self, d):
            super().__init__()
            self.ln1, self.ln2, self.mlp = torch.nn.LayerNorm(d, eps=1e-6), torch.nn.LayerNorm(d), MLP(d)

        def forward(self, x):
            h = x + self.ln1(x)
            return h + self.mlp(self.ln2(h))

    class Model(torch.nn.Module):
        def __init__(self, d=16):
            super().__init__()
            self.emb, self.blocks = torch.nn.Embedding(50, d), torch.nn.ModuleList([Block(d), Block(d)])

        def forward(self, ids):
            x = self.emb(ids)
            for b in self.blocks:
                x = b(x)
            return x

    torch.manual_seed(0)
    model = Model().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(0.1 * torch.randn_like(p))   # norms off 1 and biases off 0: a lost one shows
    folder = tmp_path_factory.mktemp("torchscript")
    files = {}
    for kind, functions in (("functions", {torch.nn.LayerNorm, MLP, Block}), ("plain", False)):
        files[kind] = folder / f"{kind}.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (torch.zeros(2, 5, dtype=torch.long),), str(files[kind]), dynamo=False,
                              opset_version=17, input_names=["input_ids"], output_names=["out"],
                              dynamic_axes={"input_ids": {0: "batch", 1: "sequence"}},
                              export_modules_as_functions=functions)
    return files


def test_torchscript_module_functions(torchscript_files):
    """TorchScript's module functions import, match ONNX Runtime, and fuse as
    the same model exported without them does."""
    proto = onnx.load(str(torchscript_files["functions"]))
    assert {f.name for f in proto.functions} == {"Block", "MLP", "LayerNorm"}
    assert any(a.ref_attr_name for f in proto.functions for n in f.node for a in n.attribute)
    model, graph = check_against_ort(torchscript_files["functions"])
    fused, ops = _fused(graph)
    fused_plain, ops_plain = _fused(trace(OnnxModel(torchscript_files["plain"])))
    assert fused == fused_plain and ops == ops_plain
    assert fused["add_layernorm"] == 3 and fused["bias_activation"] == 2   # ln1 of block 1 reads block 0's sum
