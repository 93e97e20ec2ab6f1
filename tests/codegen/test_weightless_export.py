"""Weightless ONNX export: parameters declared as external data in a laid-out
file, the file written later, and the result the same model as a normal
export -- on ONNX Runtime, checked by onnx, and without weights in memory."""
from __future__ import annotations

import os
import tracemalloc

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnx.external_data_helper import ExternalDataInfo

import blockc
from blockc.codegen.onnx_export import check_model, export_onnx, save_onnx
from blockc.codegen.onnx_weights_file import ALIGN, LARGE_ALIGN, LARGE_TENSOR, read_layout, save_onnx_weights
from blockc.errors import BlockcError, WeightsError
from blockc.ir.dims import parse_dim
from blockc.ir.dtypes import DType
from blockc.ir.graph import Graph
from blockc.ir.types import TensorType
from ort_sessions import peer_session  # noqa: E402  (tests/: the shared helper)

F32 = DType.float32


def tiny(form="fused"):
    model = blockc.build_model("tiny")
    return model, blockc.to_form(blockc.trace(model), form), blockc.init_weights(model, seed=3)


def external(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    return [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]


def feeds(model):
    rng = np.random.default_rng(0)
    return {s.name: s.sample({"batch": 2, "seq": 7}, rng) for s in model.inputs()}


def run(path, inputs) -> list[np.ndarray]:
    sess = peer_session(str(path))
    return sess.run(None, inputs)


# -- the declared layout -----------------------------------------------------------------------------
def test_every_parameter_is_declared_in_order_and_holds_no_data():
    _, g, _ = tiny()
    model = export_onnx(g, None, data_location="w.bin")
    declared = external(model)
    assert [t.name for t in declared] == list(g.params)  # parameter order
    end = 0
    for t in declared:
        v = g.params[t.name]
        info = ExternalDataInfo(t)
        assert not t.HasField("raw_data") and not t.float_data
        assert t.data_type == v.dtype.onnx_code and tuple(t.dims) == v.shape
        assert info.location == "w.bin"
        assert info.length == int(np.prod(v.shape)) * v.dtype.itemsize
        assert info.offset >= end and info.offset % ALIGN == 0 and info.offset - end < ALIGN
        end = info.offset + info.length
    # what the lowering adds (shape constants) stays inline
    assert all(t.HasField("raw_data") for t in model.graph.initializer if t not in declared)
    assert model.ByteSize() < 64 * 1024


def test_big_tensors_are_aligned_for_memory_mapping():
    g = Graph("big")
    x = g.add_input("x", TensorType(F32, (parse_dim("seq"), 512)))
    b = g.add_param("b", TensorType(F32, (512,)))                 # 2 KiB
    w = g.add_param("w", TensorType(F32, (512, LARGE_TENSOR // 2048)))  # 1 MiB
    g.set_outputs([("y", g.op("matmul", g.op("add", x, b), w))])
    (tb, tw) = external(export_onnx(g, None))
    assert ExternalDataInfo(tb).offset == 0
    assert ExternalDataInfo(tw).offset == LARGE_ALIGN
    assert ExternalDataInfo(tb).location == "big.onnx.data"  # the default name


def test_weightless_model_passes_the_checker_without_its_data():
    _, g, _ = tiny()
    model = export_onnx(g, None)
    check_model(model, weightless=True)
    # the plain checker insists the data file exists; the weightless check is everything else
    with pytest.raises(onnx.checker.ValidationError, match="onnx.data"):
        onnx.checker.check_model(model, full_check=True)


# -- writing the weights later -----------------------------------------------------------------------
@pytest.mark.parametrize("fused_as", ["function", "contrib", "onnx23"])
def test_weights_written_later_run_like_a_normal_export(tmp_path, fused_as):
    model, g, weights = tiny()
    save_onnx(g, None, tmp_path / "w.onnx", fused_as=fused_as)
    assert sorted(os.listdir(tmp_path)) == ["w.onnx"]
    data = save_onnx_weights(tmp_path / "w.onnx", weights)
    assert data == str(tmp_path / "w.onnx.data")
    save_onnx(g, weights, tmp_path / "normal.onnx", fused_as=fused_as)
    onnx.checker.check_model(str(tmp_path / "w.onnx"), full_check=True)
    inputs = feeds(model)
    for got, want in zip(run(tmp_path / "w.onnx", inputs), run(tmp_path / "normal.onnx", inputs)):
        np.testing.assert_array_equal(got, want)


def test_the_layout_is_all_another_writer_needs(tmp_path):
    # Written with nothing but the declared offsets: the layout is the contract.
    model, g, weights = tiny("standard")
    save_onnx(g, None, tmp_path / "m.onnx")
    proto = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    with open(tmp_path / "m.onnx.data", "wb") as f:
        for t in external(proto):
            f.seek(ExternalDataInfo(t).offset)
            f.write(np.ascontiguousarray(weights[t.name]).tobytes())
    loaded = onnx.load(str(tmp_path / "m.onnx"))  # onnx's own reader follows the same offsets
    for t in loaded.graph.initializer:
        if t.name in g.params:
            np.testing.assert_array_equal(numpy_helper.to_array(t), weights[t.name])
    save_onnx(g, weights, tmp_path / "normal.onnx")
    inputs = feeds(model)
    for got, want in zip(run(tmp_path / "m.onnx", inputs), run(tmp_path / "normal.onnx", inputs)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [DType.float16, DType.bfloat16])
def test_narrow_dtypes_are_laid_out_exactly(tmp_path, dtype):
    g = Graph("narrow")
    x = g.add_input("x", TensorType(dtype, (parse_dim("seq"), 5)))
    g.set_outputs([("y", g.op("matmul", x, g.add_param("w", TensorType(dtype, (5, 3)))))])
    w = np.random.default_rng(0).standard_normal((5, 3)).astype(dtype.numpy)
    save_onnx(g, None, tmp_path / "m.onnx")
    save_onnx_weights(tmp_path / "m.onnx", {"w": w})
    (t,) = [t for t in onnx.load(str(tmp_path / "m.onnx")).graph.initializer if t.name == "w"]
    assert t.data_type == dtype.onnx_code
    np.testing.assert_array_equal(numpy_helper.to_array(t).view(np.uint16), w.view(np.uint16))


def test_lazy_weights_are_read_once(tmp_path):
    _, g, weights = tiny()
    reads: dict[str, int] = {}

    class Counting(dict):
        def __getitem__(self, name):
            reads[name] = reads.get(name, 0) + 1
            return weights[name]

    save_onnx(g, None, tmp_path / "m.onnx")
    save_onnx_weights(tmp_path / "m.onnx", Counting({k: None for k in weights}))
    assert reads == {name: 1 for name in g.params}


def test_gpt3_width_never_makes_a_weight(tmp_path):
    # One 12288 x 49152 float32 MLP weight is 2.4 GB; the whole compile stays far below one.
    model = blockc.build_model("gpt2", {"layers": "2", "d_model": "12288", "heads": "96", "max_positions": "2048"})
    tracemalloc.start()
    try:
        g = blockc.optimize(blockc.trace(model)).graph
        save_onnx(g, None, tmp_path / "gpt3.onnx")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20
    _, slots = read_layout(onnx.load(str(tmp_path / "gpt3.onnx"), load_external_data=False))
    assert slots[-1].offset + slots[-1].length > 2 * 12 * 12288**2 * 4  # what it declares: ~14.5 GB


# -- bad input: clear errors, nothing half-written ---------------------------------------------------------
def test_symbolic_parameter_shapes_are_an_error(tmp_path):
    g = Graph("sym")
    x = g.add_input("x", TensorType(F32, (parse_dim("seq"), 4)))
    g.set_outputs([("y", g.op("add", x, g.add_param("p", TensorType(F32, (parse_dim("seq"), 4)))))])
    with pytest.raises(BlockcError, match="symbolic"):
        save_onnx(g, None, tmp_path / "m.onnx")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("location", ["/abs/w.data", "../w.data", "a/../../w.data", "", " "])
def test_data_location_must_stay_beside_the_model(location):
    _, g, _ = tiny()
    with pytest.raises(BlockcError, match="weights file"):
        export_onnx(g, None, data_location=location)


def test_weightless_export_with_external_data_off_is_an_error():
    _, g, _ = tiny()
    with pytest.raises(BlockcError, match="external_data=False"):
        export_onnx(g, None, external_data=False)


def test_missing_and_mismatched_weights_are_listed_at_once_and_nothing_is_left(tmp_path):
    _, g, weights = tiny()
    save_onnx(g, None, tmp_path / "m.onnx")
    bad = {k: weights[k] for k in g.params}
    del bad["tok.weight"]
    bad["pos.weight"] = np.zeros((3, 3), np.float32)
    bad["ln_f.bias"] = weights["ln_f.bias"].astype(np.float64)
    with pytest.raises(WeightsError) as info:
        save_onnx_weights(tmp_path / "m.onnx", bad)
    text = str(info.value)
    assert "3 weight(s)" in text and "tok.weight: missing" in text and "pos.weight" in text and "ln_f.bias" in text
    assert os.listdir(tmp_path) == ["m.onnx"]


def test_a_failed_write_keeps_the_previous_weights_file(tmp_path):
    _, g, weights = tiny()
    save_onnx(g, None, tmp_path / "m.onnx")
    (tmp_path / "m.onnx.data").write_bytes(b"previous")

    class Failing(dict):
        def __getitem__(self, name):
            if name == "blocks.1.ln1.weight":
                raise OSError("disk full")
            return weights[name]

    with pytest.raises(BlockcError, match="disk full"):
        save_onnx_weights(tmp_path / "m.onnx", Failing({k: None for k in weights}))
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.data"]
    assert (tmp_path / "m.onnx.data").read_bytes() == b"previous"


def test_writing_weights_for_a_model_that_has_them_is_an_error(tmp_path):
    _, g, weights = tiny()
    save_onnx(g, weights, tmp_path / "m.onnx")
    with pytest.raises(BlockcError, match="declares no weights"):
        save_onnx_weights(tmp_path / "m.onnx", weights)
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    for path in (tmp_path / "junk.onnx", tmp_path / "missing.onnx"):
        with pytest.raises(BlockcError, match="cannot read ONNX model"):
            save_onnx_weights(path, weights)


def test_a_tampered_layout_is_refused(tmp_path):
    _, g, weights = tiny()
    model = export_onnx(g, None, data_location="m.onnx.data")
    a, b = external(model)[:2]
    for entry in b.external_data:
        if entry.key == "offset":
            entry.value = str(ExternalDataInfo(a).offset + 4)
    onnx.save_model(model, str(tmp_path / "m.onnx"))
    with pytest.raises(BlockcError, match="overlap"):
        save_onnx_weights(tmp_path / "m.onnx", weights)
    assert os.listdir(tmp_path) == ["m.onnx"]


# -- the command line ------------------------------------------------------------------------------------
def test_cli_export_no_weights(tmp_path, capsys):
    from blockc.cli import main
    out = tmp_path / "m.onnx"
    assert main(["export", "tiny", "--form", "fused", "-o", str(out), "--no-weights"]) == 0
    assert "m.onnx.data" in capsys.readouterr().out
    assert os.listdir(tmp_path) == ["m.onnx"]
    assert len(external(onnx.load(str(out), load_external_data=False))) == len(tiny()[1].params)
    assert main(["export", "tiny", "-o", str(out), "--no-weights", "--weights", "w.npz"]) != 0
    assert "contradict" in capsys.readouterr().err
