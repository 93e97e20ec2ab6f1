"""`blockc cuda` leaves nothing in the temporary folder, cleans what a killed
run left in its output folder, and writes files with the user's normal
permissions (issue 11, "Leftovers")."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile

import pytest

from blockc.cli import main
from blockc.codegen.cuda import toolchain
from blockc.files import user_mode

NVCC = toolchain.find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC.path is None, reason=f"{NVCC.reason}")
TINY = ["gpt2", "--set", "layers=1", "--set", "d_model=32", "--set", "heads=2", "--set", "vocab=50"]


@pytest.fixture
def system_tmp(tmp_path, monkeypatch):
    """A private system temporary folder, to see what is left in it."""
    folder = tmp_path / "system-tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield
    os.umask(old)


def _dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)


@needs_nvcc
def test_compile_nvcc_without_out_leaves_no_folder(system_tmp, tmp_path):
    src = tmp_path / "k.cu"
    src.write_text("__global__ void k(float* x) { x[0] = 1.0f; }\n")
    result = toolchain.compile_nvcc(src, ("sm_80",))
    assert result.object_path is None and result.kernels
    src.write_text("__global__ void k(float* x) { int unused; x[0] = 1.0f; }\n")
    with pytest.raises(toolchain.ToolchainError):
        toolchain.compile_nvcc(src, ("sm_80",))
    assert list(system_tmp.iterdir()) == []


@needs_nvcc
def test_blockc_cuda_leaves_nothing_behind_and_writes_normal_permissions(system_tmp, tmp_path, umask_027,
                                                                          capsys):
    out = tmp_path / "build"
    out.mkdir()
    dead = _dead_pid()
    stale = out / f".model.cu.{dead}.abcd.tmp"  # the staging folder of a killed run
    stale.mkdir()
    (stale / "model.cu").write_text("half")
    assert main(["cuda", *TINY, "--arch", "sm_80", "-o", str(out)]) == 0, capsys.readouterr().out
    assert list(system_tmp.iterdir()) == []
    assert sorted(p.name for p in out.iterdir()) == ["blockc_cuda.h", "blockc_model.h", "build.sh", "model.cu",
                                                     "model.json", "summary.json", "weights.bin"]
    for p in out.iterdir():
        want = 0o750 if p.name == "build.sh" else 0o640
        assert stat.S_IMODE(p.stat().st_mode) == want, p.name
    assert user_mode() == 0o640 and user_mode(executable=True) == 0o750


def test_write_build_cleans_a_killed_runs_partials_but_not_a_live_ones(tmp_path):
    import blockc
    from blockc.codegen.cuda.build import write_build
    from blockc.codegen.cuda.lower import generate
    model = blockc.build_model("gpt2", {"layers": "1", "d_model": "32", "heads": "2", "vocab": "50"})
    cm = generate(blockc.to_form(blockc.trace(model), "fused"), blockc.init_weights(model))
    dead = tmp_path / f".model.cu.{_dead_pid()}.x1.tmp"
    dead.mkdir()
    live = tmp_path / f".model.cu.{os.getppid()}.x2.tmp"  # a live process's staging folder
    live.mkdir()
    write_build(cm, str(tmp_path))
    assert not dead.exists() and live.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".") and p != live]
