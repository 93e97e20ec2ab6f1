"""The CUDA build cache survives concurrent first builds, a killed build and
a damaged entry; its key covers every source of a build; it lives where
``BLOCKC_CACHE`` says (issue 11, "Files that must survive a second run and a crash")."""
from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import blockc
from blockc.codegen.cuda import build as cuda_build
from blockc.codegen.cuda import toolchain
from blockc.files import cache_root, cached_file

needs_gxx = pytest.mark.skipif(toolchain.find_gxx() is None, reason="no g++: the CUDA emulator needs one")
SETTINGS = {"layers": "1", "d_model": "32", "heads": "2", "vocab": "50"}
# What the cache holds does not depend on the model's size: a one-launch model
# (a table lookup) is a build of the runtime and host code like a gpt2's, in a
# fifth of its g++ time. The two-process test keeps a gpt2, whose longer
# build is the window in which the two first builds overlap.
LOOKUP = """graph cache_lookup(%input_ids: i64[batch,seq]) {
  param @wte: f32[50,32]
  %0:f32[batch,seq,32] = gather @wte, %input_ids {axis=0}
  return logits=%0
}
"""


def _lookup_weights(seed: int) -> dict:
    return {"wte": np.random.default_rng(seed).standard_normal((50, 32)).astype(np.float32)}


def _lookup_model(seed: int = 0):
    from blockc.codegen.cuda.lower import generate
    return generate(blockc.parse_graph(LOOKUP), _lookup_weights(seed))


def _gpt2(**changes):
    from blockc.codegen.cuda.lower import generate
    model = blockc.build_model("gpt2", {**SETTINGS, **changes})
    return generate(blockc.to_form(blockc.trace(model), "fused"), blockc.init_weights(model))


# -- the cache primitive ------------------------------------------------------------
def _slow_build(path: str, log: str, barrier) -> int:
    """One process's first use of an entry: a build that writes its file slowly."""
    def make(tmp: Path) -> None:
        with open(log, "a") as f:
            f.write("built\n")
        with open(tmp, "wb") as f:
            for _ in range(20):
                f.write(b"x" * 1000)
                f.flush()
                time.sleep(0.01)
    barrier.wait()
    got = cached_file(path, make)
    return got.stat().st_size


def test_concurrent_first_builds_build_once_and_never_see_a_partial_file(tmp_path):
    path, log = tmp_path / "entry.so", tmp_path / "log"
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Manager().Barrier(4)
    with ctx.Pool(4) as pool:
        sizes = pool.starmap(_slow_build, [(str(path), str(log), barrier)] * 4)
    assert sizes == [20_000] * 4
    assert log.read_text() == "built\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry.so", "entry.so.lock", "entry.so.ok", "log"]


@pytest.mark.parametrize("damage", ["empty", "truncated", "changed", "no record"])
def test_a_damaged_entry_is_rebuilt(tmp_path, damage):
    path, builds = tmp_path / "entry.so", []

    def make(tmp: Path) -> None:
        builds.append(tmp)
        tmp.write_bytes(b"library" * 100)
    cached_file(path, make)
    if damage == "empty":
        path.write_bytes(b"")
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:-7])
    elif damage == "changed":
        path.write_bytes(b"LIBRARY" * 100)
    else:
        (tmp_path / "entry.so.ok").unlink()
    assert cached_file(path, make).read_bytes() == b"library" * 100
    assert len(builds) == 2
    cached_file(path, make)
    assert len(builds) == 2


def test_a_killed_build_leaves_nothing_that_breaks_the_next(tmp_path):
    path = tmp_path / "entry.so"
    # What a kill -9 leaves: a 0-byte entry with no record, and a partial file of a dead process.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    path.write_bytes(b"")
    partial = tmp_path / f".entry.so.{dead}.build.tmp"
    partial.write_bytes(b"half")
    cached_file(path, lambda tmp: tmp.write_bytes(b"whole"))
    assert path.read_bytes() == b"whole" and not partial.exists()


def test_a_failed_build_leaves_no_entry(tmp_path):
    path = tmp_path / "entry.so"

    def make(tmp: Path) -> None:
        tmp.write_bytes(b"half")
        raise RuntimeError("compiler died")
    with pytest.raises(RuntimeError):
        cached_file(path, make)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry.so.lock"]


def test_blockc_cache_sets_the_one_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("BLOCKC_CACHE", str(tmp_path / "here"))
    assert cache_root() == tmp_path / "here" and cache_root().is_dir()
    assert cuda_build.cache_dir() == str(tmp_path / "here")


# -- the key ------------------------------------------------------------------------
def test_the_key_covers_the_emulator_runtime_header_flags_and_compiler(tmp_path, monkeypatch):
    cm = _lookup_model()
    before = cuda_build.source_hash(cm, "emu", compiler="g++ 13")
    assert cuda_build.source_hash(cm, "emu", compiler="g++ 14") != before
    assert cuda_build.source_hash(cm, "emu", "-O3", compiler="g++ 13") != before
    original, emu = toolchain.EMU_DIR, tmp_path / "emu"
    shutil.copytree(toolchain.EMU_DIR, emu)
    monkeypatch.setattr(toolchain, "EMU_DIR", emu)
    assert cuda_build.source_hash(cm, "emu", compiler="g++ 13") == before
    with open(emu / "cuda_emu_sched.cpp", "a") as f:
        f.write("\n// a change to the emulator\n")
    assert cuda_build.source_hash(cm, "emu", compiler="g++ 13") != before
    header = tmp_path / "blockc_cuda.h"
    header.write_bytes(Path(cuda_build.RUNTIME_HEADER).read_bytes() + b"\n")
    monkeypatch.setattr(toolchain, "EMU_DIR", original)
    monkeypatch.setattr(cuda_build, "RUNTIME_HEADER", str(header))
    assert cuda_build.source_hash(cm, "emu", compiler="g++ 13") != before


# -- real emulated builds -----------------------------------------------------------
@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cache")
    old = os.environ.get("BLOCKC_CACHE")
    os.environ["BLOCKC_CACHE"] = str(folder)
    yield folder
    if old is None:
        del os.environ["BLOCKC_CACHE"]
    else:
        os.environ["BLOCKC_CACHE"] = old


def _run(cm, so):
    from blockc.runtime.cuda_runner import run_model
    ids = np.arange(6, dtype=np.int64).reshape(1, 6) % 50
    name = cm.inputs[0][0]
    out = run_model(cm, so, {name: ids}, emulated=True).outputs
    return out


@needs_gxx
def test_every_emulated_build_is_under_blockc_cache(cache):
    from blockc.runtime.cuda_runner import emulated_library
    so = emulated_library(_lookup_model())
    assert so.is_relative_to(cache)
    assert list((cache / "emu").glob("*/cuda_emu_runtime.o"))  # the emulator's own objects too


@needs_gxx
def test_one_entry_serves_every_weights_of_a_graph_and_holds_none(cache):
    # the key is the graph's build; the weights are each run's, uploaded at load
    from blockc.runtime.cuda_runner import emulated_library, run_model
    graph = blockc.parse_graph(LOOKUP)
    ids = {"input_ids": np.arange(6, dtype=np.int64).reshape(1, 6) % 50}
    outputs = []
    for seed in (0, 1):
        weights = _lookup_weights(seed)
        cm = _lookup_model(seed)
        so = emulated_library(cm)
        outputs.append(run_model(cm, so, ids, emulated=True).outputs["logits"])
        np.testing.assert_allclose(outputs[-1], blockc.run_reference(graph, weights, ids)["logits"], rtol=1e-4,
                                   atol=1e-4)
    assert len([p for p in cache.iterdir() if p.name.startswith(graph.name)]) == 1
    assert not list(cache.rglob("weights.bin"))
    assert not np.allclose(outputs[0], outputs[1])


@needs_gxx
@pytest.mark.parametrize("damage", [b"", b"\x7fELF"])
def test_a_truncated_cached_library_is_rebuilt(cache, damage):
    from blockc.runtime.cuda_runner import emulated_library
    cm = _lookup_model()
    so = emulated_library(cm)
    expected = _run(cm, so)
    so.write_bytes(damage)  # what a kill -9 or a full disk leaves
    again = emulated_library(cm)
    assert again == so and so.stat().st_size > 1000
    for name, value in _run(cm, again).items():
        np.testing.assert_array_equal(value, expected[name])


@needs_gxx
def test_two_processes_building_one_model_for_the_first_time(cache, tmp_path):
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_cuda_cache import _gpt2, _run
        from blockc.runtime.cuda_runner import emulated_library
        cm = _gpt2(d_model="48")
        out = _run(cm, emulated_library(cm))
        print(sorted(out))
    """)
    env = {**os.environ, "BLOCKC_CACHE": str(cache)}
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err


# -- a cached GPU build finds cuBLASLt wherever it is now ------------------------------
def test_the_gpu_child_finds_cublas_through_the_loader_path_not_only_the_runpath(monkeypatch, tmp_path):
    # a cached library's RUNPATH names where cuBLASLt was at build time; the
    # runner puts where it is now first on the child's loader path
    from blockc.runtime import cuda_runner
    now = toolchain.CublasLocation(str(tmp_path / "inc"), str(tmp_path / "moved" / "lib"), 13, "moved")
    monkeypatch.setattr(toolchain, "find_cublas", lambda *a, **k: now)
    monkeypatch.setenv("LD_LIBRARY_PATH", "/elsewhere")
    assert cuda_runner._child_env(None, emulated=False)["LD_LIBRARY_PATH"] == f"{now.lib}:/elsewhere"
    assert cuda_runner._child_env(None, emulated=True)["LD_LIBRARY_PATH"] == "/elsewhere"   # the emulator needs none
