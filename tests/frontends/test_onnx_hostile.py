"""Hostile ONNX files: each is refused with one line naming the file and the
problem (exit status 2 from the CLI), never a traceback, a hang, a read
outside the model's folder or an allocation the file's data does not back.
Names built to break generated code are labels: they import and print."""
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from blockc.cli import main
from blockc.errors import OnnxFileError
from blockc.frontends.onnx import OnnxModel, safe_load
from blockc.ir.parser import parse_graph
from blockc.ir.printer import print_graph
from ort_sessions import peer_session  # noqa: E402  (tests/: the shared helper)


def _model(weight: TensorProto, tmp_path, name="m.onnx"):
    """y = x @ w, with ``weight`` as w."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], [y], [weight])
    path = tmp_path / name
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return path


def _tensor(dims, raw=None):
    """A float tensor 'w' claiming ``dims``, holding ``raw`` bytes (or no data at all)."""
    t = TensorProto()
    t.name, t.data_type = "w", TensorProto.FLOAT
    t.dims.extend(dims)
    if raw is not None:
        t.raw_data = raw
    return t


def _external(tmp_path, location, offset=0, length=None, data=b"\0" * 32):
    (tmp_path / "w.bin").write_bytes(data)
    t = _tensor([4, 2])
    t.data_location = TensorProto.EXTERNAL
    for k, v in [("location", location), ("offset", str(offset))] + ([("length", str(length))] if length else []):
        e = t.external_data.add()
        e.key, e.value = k, v
    return _model(t, tmp_path)


def refused(path, capsys, *words):
    """The CLI refuses ``path`` with exit status 2 and one line holding ``words``."""
    assert main(["show", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("blockc: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for w in words:
        assert w in err, err
    with pytest.raises(OnnxFileError):
        OnnxModel(path)
    return err


def test_external_data_inside_the_folder_loads(tmp_path):
    model = OnnxModel(_external(tmp_path, "w.bin", data=np.arange(8, dtype=np.float32).tobytes()))
    assert (model.parameter("w").init((4, 2), None) == np.arange(8).reshape(4, 2)).all()


def test_truncated(tmp_path, capsys):
    good = _model(numpy_helper.from_array(np.ones((4, 2), np.float32), "w"), tmp_path)
    bad = tmp_path / "cut.onnx"
    bad.write_bytes(good.read_bytes()[:-20])
    refused(bad, capsys, "cut.onnx", "not a valid ONNX file")


def test_not_protobuf(tmp_path, capsys):
    bad = tmp_path / "junk.onnx"
    bad.write_bytes(b"\xff" * 64)
    refused(bad, capsys, "junk.onnx", "not a valid ONNX file")


def test_missing(tmp_path, capsys):
    refused(tmp_path / "none.onnx", capsys, "none.onnx", "not found")


def test_absolute_location(tmp_path, capsys):
    refused(_external(tmp_path, "/etc/passwd"), capsys, "m.onnx", "'/etc/passwd' is an absolute path")


def test_location_climbing_out(tmp_path, capsys):
    refused(_external(tmp_path, "../../etc/passwd"), capsys, "'../../etc/passwd' climbs out of the model's folder")


def test_symlink_pointing_out(tmp_path, capsys):
    inner = tmp_path / "model"
    inner.mkdir()
    (tmp_path / "secret.bin").write_bytes(b"\0" * 32)
    os.symlink(tmp_path / "secret.bin", inner / "link.bin")
    refused(_external(inner, "link.bin"), capsys, "'link.bin' is a link pointing out of the model's folder")


def test_offset_past_the_end(tmp_path, capsys):
    refused(_external(tmp_path, "w.bin", offset=1000), capsys, "runs past the end of 'w.bin' (32 bytes)")


def test_length_past_the_end(tmp_path, capsys):
    refused(_external(tmp_path, "w.bin", offset=16, length=32), capsys, "[16, 48) runs past the end")


def test_length_not_the_shape(tmp_path, capsys):
    refused(_external(tmp_path, "w.bin", length=16), capsys, "needs 32 bytes, but its external data has length 16")


def test_huge_shape_without_data(tmp_path, capsys):
    refused(_model(_tensor([4, 10**12], raw=b""), tmp_path), capsys, "shape [4, 1000000000000] of float32 needs 16,000,000,000,000 bytes, "
                                         "but the file holds 0")
    refused(_model(_tensor([4, 10**12]), tmp_path), capsys, "claims 4,000,000,000,000 values, but the file holds 0")


def test_external_weights_past_memory_are_refused_where_read(tmp_path, capsys, monkeypatch):
    """External weights are read where a command needs their values, and
    refused there, before reading, when they cannot fit; a command that reads
    none (show, summary) does not refuse them."""
    from blockc.frontends import module
    t = numpy_helper.from_array(np.zeros((4, 4096), np.float32), "w")   # 64 KiB
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "w.bin"), ("offset", "0")):
        e = t.external_data.add()
        e.key, e.value = k, v
    (tmp_path / "w.bin").write_bytes(b"\0" * 4 * 4 * 4096)
    path = _model(t, tmp_path)
    for where in (module, safe_load):
        monkeypatch.setattr(where, "available_memory", lambda: 32 * 1024)
    assert main(["show", str(path)]) == 0 and main(["summary", str(path)]) == 0
    capsys.readouterr()
    assert main(["run", str(path), "--backend", "reference"]) == 2
    err = capsys.readouterr().err
    assert "64 KiB" in err and "more than the 32 KiB of memory available" in err, err
    with pytest.raises(OnnxFileError, match="its external data takes 64 KiB, more than the 32 KiB"):
        OnnxModel(path).parameter("w").init((4, 4096), None)


def _graph_file(nodes, tmp_path, name="g.onnx"):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    path = tmp_path / name
    path.write_bytes(helper.make_model(helper.make_graph(nodes, "g", [x], [y]),
                                       opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return path


def test_cycle(tmp_path, capsys):
    path = _graph_file([helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Add", ["a", "x"], ["b"]),
                        helper.make_node("Relu", ["b"], ["y"])], tmp_path)
    refused(path, capsys, "the graph has a cycle")


def test_undefined_input(tmp_path, capsys):
    path = _graph_file([helper.make_node("Add", ["x", "nowhere\n*/"], ["y"])], tmp_path)
    refused(path, capsys, "reads 'nowhere\\n*/', which no input, initializer or node defines")


HOSTILE = ['a"b', "*/ int x; /*", "line\nbreak", "#include <stdio.h>", "int", "while", "x" * 10_000,
           "naïve→名前", "\x1b[31mred"]


def test_hostile_names_are_labels(tmp_path):
    """Names meant to break generated code import, print and parse back, and
    the graph computes what ONNX Runtime computes."""
    w = numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(4, 2), HOSTILE[0])
    nodes, prev = [], "in"
    for i, name in enumerate(HOSTILE[1:]):
        nodes.append(helper.make_node("Relu" if i % 2 else "Neg", [prev], [name], name=name))
        prev = name
    nodes.append(helper.make_node("MatMul", [prev, HOSTILE[0]], ["out */"], name="#define"))
    x = helper.make_tensor_value_info("in", TensorProto.FLOAT, ["b\n a t*/ch", 4])
    y = helper.make_tensor_value_info("out */", TensorProto.FLOAT, None)
    path = tmp_path / "names.onnx"
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", [x], [y], [w]),
                                opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    from blockc.frontends import init_weights, trace
    from blockc.runtime.reference import run_reference
    model = OnnxModel(path)
    graph = trace(model)
    assert graph.symbols() == ["b_a_t_ch"]
    text = print_graph(graph)
    assert print_graph(parse_graph(text)) == text
    feeds = {"in": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)}
    ours = run_reference(graph, init_weights(model), feeds)["out */"]
    theirs = peer_session(str(path)).run(None, feeds)[0]
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)


def test_hostile_name_in_a_message_is_escaped_and_short(tmp_path, capsys):
    path = _graph_file([helper.make_node("Add", ["x", "\x1b[31m" + "y" * 10_000], ["y"])], tmp_path)
    err = refused(path, capsys, "\\x1b[31m", "(10,005 characters)")
    assert len(err) < 400


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (wire type 2)."""
    def varint(n):
        out = b""
        while True:
            out, n = out + bytes([(n & 0x7F) | (0x80 if n > 0x7F else 0)]), n >> 7
            if not n:
                return out
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def test_deeply_nested(tmp_path, capsys):
    """Subgraphs nested past protobuf's recursion limit: refused, no RecursionError.
    Written as wire bytes: onnx.helper itself cannot copy such a graph."""
    graph = b""
    for _ in range(150):  # GraphProto.node{op_type "If", attribute{name, g: graph, type GRAPH}}
        attribute = _field(1, b"then_branch") + _field(6, graph) + bytes([20 << 3 & 0x7F | 0x80, 1, 5])
        graph = _field(1, _field(4, b"If") + _field(5, attribute))
    path = tmp_path / "deep.onnx"
    path.write_bytes(bytes([8, 8]) + _field(7, graph))   # ir_version 8, graph
    refused(path, capsys, "deep.onnx", "not a valid ONNX file (truncated or malformed protobuf")


def test_enormous_file_refused_before_parsing(tmp_path, capsys, monkeypatch):
    path = _model(numpy_helper.from_array(np.ones((4, 2), np.float32), "w"), tmp_path)
    monkeypatch.setattr(safe_load, "MAX_PROTO_BYTES", 100)
    refused(path, capsys, "more than an ONNX protobuf can hold (2 GiB)")


# ---- local functions ----------------------------------------------------------------
def _calls_file(tmp_path, nodes, functions, name="calls.onnx"):
    """y = ``nodes`` of x (float [2]), calling ``functions`` (domain 'local')."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    path = tmp_path / name
    path.write_bytes(helper.make_model(helper.make_graph(nodes, "g", [x], [y]), functions=functions,
                                       opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])
                     .SerializeToString())
    return path


def _fn(name, nodes, inputs=("X",), outputs=("Y",), **kw):
    return helper.make_function("local", name, list(inputs), list(outputs), nodes,
                                [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)], **kw)


def _call(op, x="X", y="Y", **kw):
    return helper.make_node(op, [x], [y], domain="local", **kw)


def _constant_of(attribute: str):
    """c = Constant(value_float = the function's ``attribute``)."""
    node = helper.make_node("Constant", [], ["c"])
    a = node.attribute.add()
    a.name, a.type, a.ref_attr_name = "value_float", onnx.AttributeProto.FLOAT, attribute
    return node


@pytest.mark.parametrize("functions, words", [
    ([_fn("F", [_call("F")])], "function 'local::F' calls itself ('local::F' -> 'local::F')"),
    ([_fn("A", [_call("B")]), _fn("B", [helper.make_node("Relu", ["X"], ["r"]), _call("C", "r")]),
      _fn("C", [_call("A")])],
     "function 'local::A' calls itself ('local::A' -> 'local::B' -> 'local::C' -> 'local::A')"),
], ids=["itself", "through-others"])
def test_recursive_function(functions, words, tmp_path, capsys):
    """A function that calls itself would be inlined forever: refused naming the cycle."""
    path = _calls_file(tmp_path, [_call("A" if len(functions) > 1 else "F", "x", "y")], functions)
    refused(path, capsys, "calls.onnx", words, "a recursive function cannot be inlined")


def test_calls_that_multiply(tmp_path, capsys):
    """64 functions, each calling the next twice: a file of a few kilobytes
    naming 2**64 nodes, refused at once, before any is made."""
    functions = [_fn(f"F{i}", [_call(f"F{i + 1}", "X", "h"), _call(f"F{i + 1}", "h", "Y")]) for i in range(64)]
    functions.append(_fn("F64", [helper.make_node("Relu", ["X"], ["Y"])]))
    path = _calls_file(tmp_path, [_call("F0", "x", "y")], functions)
    assert path.stat().st_size < 20_000
    refused(path, capsys, "inlining its functions would make 18,446,744,073,709,551,616 nodes",
            "more than the", "memory available")


def test_calls_nested_thousands_deep(tmp_path):
    """3,000 functions, each calling the next under a name 1,000 characters
    long: inlined without Python recursion, and the names inlining makes stay
    short (they are labels, unique apart from their text)."""
    from blockc.frontends import trace
    from blockc.frontends.onnx.functions import NAME_CHARS
    from blockc.runtime.reference import run_reference
    depth = 3000
    functions = [_fn(f"F{i}", [_call(f"F{i + 1}", "X", "h", name="n" * 1000), helper.make_node("Neg", ["h"], ["Y"])])
                 for i in range(depth)]
    functions.append(_fn(f"F{depth}", [helper.make_node("Relu", ["X"], ["Y"])]))
    model = OnnxModel(_calls_file(tmp_path, [_call("F0", "x", "y")], functions))
    assert len(model.nodes) == depth + 1
    assert max(len(name) for n in model.nodes for name in (n.name, *n.output)) <= NAME_CHARS + 10
    x = np.array([-1.5, 2.0], np.float32)
    np.testing.assert_array_equal(run_reference(trace(model), {}, {"x": x})["y"], np.maximum(x, 0))   # an even depth


@pytest.mark.parametrize("nodes, functions, words", [
    ([_call("F", "x", "y")], [_fn("F", [helper.make_node("Add", ["X", "nowhere"], ["Y"])])],
     "function 'local::F': node 0 ('Add') reads 'nowhere', which none of its inputs or nodes defines"),
    ([_call("F", "x", "y")], [_fn("F", [helper.make_node("Relu", ["X"], ["h"])])],
     "function 'local::F': its output 'Y' is not defined by any of its nodes or inputs"),
    ([_call("F", "x", "y")], [_fn("F", [helper.make_node("Relu", ["X"], ["Y"])])] * 2,
     "function 'local::F' is defined twice"),
    ([helper.make_node("F", ["x", "x"], ["y"], domain="local")], [_fn("F", [helper.make_node("Relu", ["X"], ["Y"])])],
     "node 'y' (function 'local::F'): gives 2 inputs and 1 outputs; the function takes 1 and 1"),
    ([_call("F", "x", "y", alpha=2)], [_fn("F", [_constant_of("alpha"), helper.make_node("Mul", ["X", "c"], ["Y"])],
                                          attributes=["alpha"])],
     "node 'y' (function 'local::F'): attribute 'alpha' is INT, but its body's node 'Constant' reads it as FLOAT"),
    ([helper.make_node("Relu", ["x"], ["h"]), _constant_of("alpha"), helper.make_node("Mul", ["h", "c"], ["y"])], [],
     "node 'c' ('Constant'): its attribute 'value_float' refers to 'alpha', but only a function's nodes can"),
], ids=["undefined-name", "undefined-output", "defined-twice", "too-many-inputs", "attribute-type",
        "reference-outside-a-function"])
def test_malformed_function(nodes, functions, words, tmp_path, capsys):
    refused(_calls_file(tmp_path, nodes, functions), capsys, words)


def test_tensor_in_a_function_body_is_checked(tmp_path, capsys):
    """A body's tensor attribute is read as the graph's are: a shape its
    data does not back is refused, not allocated (once, however many calls)."""
    constant = helper.make_node("Constant", [], ["c"], value=_tensor([4, 10**12], raw=b""))
    body = _fn("F", [constant, helper.make_node("Add", ["X", "c"], ["Y"])])
    path = _calls_file(tmp_path, [_call("F", "x", "h"), _call("F", "h", "y")], [body])
    assert main(["show", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "attribute value: shape [4, 1000000000000] of float32 needs 16,000,000,000,000 bytes, but the file holds 0" \
        in err


def test_a_long_recursive_cycle_is_named_by_its_ends(tmp_path, capsys):
    functions = [_fn(f"F{i}", [_call(f"F{(i + 1) % 1000}")]) for i in range(1000)]
    err = refused(_calls_file(tmp_path, [_call("F0", "x", "y")], functions), capsys,
                  "function 'local::F0' calls itself ('local::F0' -> 'local::F1' -> 'local::F2' -> 'local::F3' -> "
                  "... 994 more ... -> 'local::F998' -> 'local::F999' -> 'local::F0')")
    assert len(err) < 400
