"""Optimum's merged decoder (``decoder_model_merged.onnx``) holds its two
graphs, without and with the cache, as the branches of an ``If`` on the
``use_cache_branch`` input: which one runs is decided when it runs, and
blockc traces one graph. It is refused by the node's name, saying which
files to import instead, before the generic list of missing operators. The
file is built here in the merged form with onnx.helper; ONNX Runtime runs
it (it is a valid model), blockc does not."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from blockc.cli import main
from blockc.errors import OnnxFileError
from blockc.frontends.onnx import OnnxModel
from ort_sessions import peer_session  # noqa: E402  (tests/: the shared helper)



def merged_file(path, extra_op: str | None = None):
    """``y = use_cache_branch ? relu(x) : -x``, as Optimum merges its two decoders."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    flag = helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])

    def branch(name, op):
        out = helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, ["batch", 4])
        return helper.make_graph([helper.make_node(op, ["x"], [f"{name}_y"])], name, [], [out])
    nodes = [helper.make_node("If", ["use_cache_branch"], ["h"], name="optimum::if",
                              then_branch=branch("with_past", "Relu"), else_branch=branch("without_past", "Neg"))]
    nodes.append(helper.make_node(extra_op or "Identity", ["h"], ["y"]))
    model = helper.make_model(helper.make_graph(nodes, "merged", [x, flag], [y]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


MESSAGE = ("node 'optimum::if' (If): chooses between two subgraphs by 'use_cache_branch' when it runs, which "
           "blockc's ONNX import cannot (it traces one graph). Optimum's merged decoder (decoder_model_merged.onnx) "
           "branches so on use_cache_branch: import its decoder_model.onnx and decoder_with_past_model.onnx apart "
           "(python -m optimum.exporters.onnx --no-post-process writes them)")


def test_the_file_is_one_onnx_runtime_runs(tmp_path):
    session = peer_session(str(merged_file(tmp_path / "m.onnx")))
    x = np.array([[-1.0, 2.0, -3.0, 4.0]], np.float32)
    for flag, want in ((True, np.maximum(x, 0)), (False, -x)):
        np.testing.assert_array_equal(session.run(None, {"x": x, "use_cache_branch": np.array([flag])})[0], want)


def test_a_merged_decoder_is_refused_by_its_if(tmp_path):
    path = merged_file(tmp_path / "m.onnx")
    with pytest.raises(OnnxFileError) as e:
        OnnxModel(path)
    assert str(e.value) == f"{path}: {MESSAGE}"


def test_the_if_is_named_before_other_missing_operators(tmp_path):
    path = merged_file(tmp_path / "m.onnx", extra_op="HardSwish")
    with pytest.raises(OnnxFileError, match=r"\(If\): chooses between two subgraphs"):
        OnnxModel(path)


def test_the_cli_says_it_in_one_line(tmp_path, capsys):
    path = merged_file(tmp_path / "m.onnx")
    assert main(["show", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"blockc: error: {path}: {MESSAGE}\n"
