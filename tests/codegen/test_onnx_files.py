"""ONNX exports survive a second run and a crash: the same export twice in
one folder, a tensor past protobuf's limit, a killed export's partial files,
and a weightless export over a stale data file (issue 11)."""
from __future__ import annotations

import os
import stat
import subprocess
import sys

import numpy as np
import onnx
import pytest
from google.protobuf.message import EncodeError

from blockc.codegen import onnx_export
from blockc.codegen.onnx_export import save_onnx
from blockc.codegen.onnx_weights_file import save_onnx_weights
from blockc.ir.dims import parse_dim
from blockc.ir.dtypes import DType
from blockc.ir.graph import Graph
from blockc.ir.types import TensorType
from ort_sessions import peer_session  # noqa: E402  (tests/: the shared helper)

F32 = DType.float32


def matmul(n: int = 32) -> Graph:
    g = Graph("matmul")
    x = g.add_input("x", TensorType(F32, (parse_dim("seq"), n)))
    w = g.add_param("w", TensorType(F32, (n, n)))
    b = g.add_param("b", TensorType(F32, (n,)))
    g.set_outputs([("y", g.op("add", g.op("matmul", x, w), b))])
    return g


def weights(seed: int, n: int = 32) -> dict:
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((n, n)).astype(np.float32), "b": rng.standard_normal(n).astype(np.float32)}


def run(path, w) -> None:
    """The model at ``path`` runs on ONNX Runtime and computes ``x @ w + b`` with ``w``."""
    x = np.random.default_rng(9).standard_normal((3, 32)).astype(np.float32)
    (y,) = peer_session(str(path)).run(None, {"x": x})
    np.testing.assert_allclose(y, x @ w["w"] + w["b"], rtol=1e-5, atol=1e-5)


def dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)


@pytest.mark.parametrize("how", [{"external_data": True}, {"external_threshold": 64}, {}])
def test_the_same_export_twice_in_one_folder_replaces_the_first(tmp_path, how):
    path = tmp_path / "m.onnx"
    for seed in (1, 2):
        save_onnx(matmul(), weights(seed), path, **how)
        run(path, weights(seed))
    expected = ["m.onnx", "m.onnx.data"] if how else ["m.onnx"]
    assert sorted(os.listdir(tmp_path)) == expected


def test_a_tensor_past_protobufs_limit_is_exported(tmp_path, monkeypatch):
    # protobuf cannot hold a tensor of 2 GiB; here the limit is 1 KiB, the weight 4 KiB
    real = onnx_export.numpy_helper.from_array

    def limited(array, name=None):
        if array.nbytes > 1024:
            raise EncodeError("Failed to serialize proto")
        return real(array, name)
    monkeypatch.setattr(onnx_export.numpy_helper, "from_array", limited)
    path = tmp_path / "m.onnx"
    save_onnx(matmul(), weights(1), path, external_threshold=1024)
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.data"]
    onnx.checker.check_model(str(path), full_check=True)
    run(path, weights(1))


def test_a_killed_exports_partial_files_are_removed_by_the_next(tmp_path):
    path = tmp_path / "m.onnx"
    stale = tmp_path / f".m.onnx.{dead_pid()}.k3j2.tmp"  # what kill -9 during an export leaves
    stale.mkdir()
    (stale / "m.onnx.data").write_bytes(b"\0" * 4096)
    live = tmp_path / f".m.onnx.{os.getppid()}.k3j2.tmp"  # an export running now: not touched
    live.mkdir()
    save_onnx(matmul(), weights(1), path, external_data=True)
    assert sorted(os.listdir(tmp_path)) == [live.name, "m.onnx", "m.onnx.data"]


def test_a_weightless_export_never_pairs_with_a_stale_data_file(tmp_path):
    path = tmp_path / "m.onnx"
    save_onnx(matmul(), weights(1), path, external_data=True)
    save_onnx(matmul(), None, path)  # the layout of another export: removed, not reused
    assert sorted(os.listdir(tmp_path)) == ["m.onnx"]
    with pytest.raises(Exception):
        peer_session(str(path))
    save_onnx_weights(path, weights(2))
    run(path, weights(2))


def test_an_inline_export_removes_a_stale_data_file(tmp_path):
    path = tmp_path / "m.onnx"
    save_onnx(matmul(), weights(1), path, external_data=True)
    save_onnx(matmul(), weights(2), path, external_data=False)
    assert sorted(os.listdir(tmp_path)) == ["m.onnx"]
    run(path, weights(2))


def test_exported_files_get_the_users_permissions(tmp_path):
    old = os.umask(0o027)
    try:
        path = tmp_path / "m.onnx"
        save_onnx(matmul(), weights(1), path, external_data=True)
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
        save_onnx(matmul(), None, tmp_path / "n.onnx")
        save_onnx_weights(tmp_path / "n.onnx", weights(1))
        modes.update({p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()})
    finally:
        os.umask(old)
    assert modes == {"m.onnx": 0o640, "m.onnx.data": 0o640, "n.onnx": 0o640, "n.onnx.data": 0o640}
