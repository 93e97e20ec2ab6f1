"""What a model's trace depends on, said before tracing (``frontends/trace_key.py``):
equal for models that trace alike, different for any setting or step that
changes the graph, and None where only the trace can tell."""
from blockc.frontends import build_model, trace
from blockc.frontends.models import DecoderLM
from blockc.frontends.trace_key import trace_key
from blockc.ir.printer import print_graph


def tiny(**sets):
    return build_model("tiny", {"layers": "1", **sets})


def test_models_that_trace_alike_have_one_key_and_a_setting_or_step_changes_it():
    a, b = tiny(), tiny()
    assert trace_key(a) == trace_key(b) and print_graph(trace(a)) == print_graph(trace(b))
    keys = {trace_key(m) for m in (a, tiny(eps="1e-6"), tiny(dtype="float16"), a.for_cache("prefill"),
                                   a.for_cache("prefill", padded=False), a.for_cache("decode", cache_len=8),
                                   a.for_cache("decode", cache_len=9), build_model("gpt2-block", {}))}
    assert len(keys) == 8 and None not in keys


def test_a_subclass_or_a_users_model_has_none():
    class Mine(DecoderLM):   # may trace otherwise under the same config
        pass
    assert trace_key(Mine(tiny().cfg)) is None


def test_an_onnx_files_key_is_its_graph_without_its_weights(tmp_path):
    """Weights changed in the file keep the key (they are bound at load); a
    changed node or constant, or other dims for its inputs, change it."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    from blockc.codegen.onnx_export import export_onnx
    from blockc.frontends import init_weights
    from blockc.frontends.onnx.model import OnnxModel
    model = tiny()
    proto = export_onnx(trace(model), dict(init_weights(model, seed=0)))

    def key(folder, change=None, **kw):   # one file name in every folder: the name is part of the key
        p = onnx.ModelProto()
        p.CopyFrom(proto)
        if change:
            change(p)
        (tmp_path / folder).mkdir(exist_ok=True)
        onnx.save(p, tmp_path / folder / "m.onnx")
        return trace_key(OnnxModel(tmp_path / folder / "m.onnx", **kw))

    def add_one(p, picked):
        t = next(t for t in p.graph.initializer if picked(t))
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) + 1, t.name))

    def weights(p):
        add_one(p, lambda t: t.data_type == onnx.TensorProto.FLOAT and np.prod(t.dims) > 1)

    def constant(p):   # an int64 shape or index: read as part of the graph
        add_one(p, lambda t: t.data_type == onnx.TensorProto.INT64)

    def node(p):
        p.graph.node[-1].name += "x"
    base = key("base")
    assert key("weights", weights) == base
    assert len({base, key("constant", constant), key("node", node), key("dims", dims={"seq": 5})}) == 4


def test_a_model_changed_after_it_was_built_keys_as_it_traces_or_not_at_all():
    """Its config unchanged, a model whose dtype, module or setting was set
    after it was built traces otherwise: it gets another key, or None where a
    setting has no stable text (a user's object)."""
    from blockc.ir.dtypes import DType
    base = trace_key(tiny())
    halved = tiny()
    halved.dtype = DType.float16
    assert print_graph(trace(halved)) != print_graph(trace(tiny())) and trace_key(halved) not in (base, None)
    eps = tiny()
    norm = next(m for _, m in eps.named_modules() if hasattr(m, "eps"))
    norm.eps = 0.5
    assert print_graph(trace(eps)) != print_graph(trace(tiny())) and trace_key(eps) not in (base, None)
    odd = tiny()
    norm = next(m for _, m in odd.named_modules() if hasattr(m, "eps"))
    norm.eps = object()
    assert trace_key(odd) is None
    users = tiny()
    module = next(m for _, m in users.named_modules() if hasattr(m, "eps"))
    module.__class__ = type("Mine", (type(module),), {"__module__": "users_file"})   # its forward its own
    assert trace_key(users) is None


def constant_file(folder, shift) -> str:
    """``y = x + c`` where ``c`` is a ``Constant`` whose tensor lies in
    ``c.bin`` beside the file (external data): the file itself holds only
    its location and length."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper
    folder.mkdir(exist_ok=True)
    (folder / "c.bin").write_bytes(np.asarray(shift, np.float32).tobytes())
    c = TensorProto(name="c", data_type=TensorProto.FLOAT, dims=[4])
    c.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "c.bin"), ("offset", "0"), ("length", "16")):
        c.external_data.add(key=key, value=value)
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], value=c), helper.make_node("Add", ["x", "c"], ["y"])], "shift",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, folder / "m.onnx")
    return str(folder / "m.onnx")


def test_a_constants_external_bytes_are_part_of_an_onnx_files_key(tmp_path):
    from blockc.frontends.onnx.model import OnnxModel
    keys = [trace_key(OnnxModel(constant_file(tmp_path / f, shift))) for f, shift in
            (("a", [1, 2, 3, 4]), ("b", [1, 2, 3, 4]), ("c", [1, 2, 3, 5]))]
    assert keys[0] == keys[1] != keys[2]


def test_a_warm_run_of_a_file_whose_constant_changed_outside_it_gives_the_new_answer(tmp_path, monkeypatch):
    """The fused graph kept in the cache holds the constant: a run after the
    external bytes changed (the .onnx untouched) is ONNX Runtime's answer on
    the file as it is now, not the cached one's."""
    import numpy as np

    from blockc.cli import main
    from ort_sessions import peer_session  # noqa: E402  (tests/: the shared helper)
    monkeypatch.setenv("BLOCKC_CACHE", str(tmp_path / "cache"))
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.savez(tmp_path / "x.npz", x=x)
    for shift in ([1, 2, 3, 4], [10, 20, 30, 40]):
        path = constant_file(tmp_path / "model", shift)
        out = tmp_path / "y.npz"
        assert main(["run", path, "--inputs", str(tmp_path / "x.npz"), "--save", str(out), "--form", "fused"]) == 0
        (want,) = peer_session(path).run(None, {"x": x})
        np.testing.assert_array_equal(np.load(out)["y"], want)
