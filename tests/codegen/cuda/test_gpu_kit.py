"""bench/gpu_kernels.py, the GPU measurement kit, runs before a GPU is lent:
emulated at toy sizes it builds each row kernel at each length, times every
one with CUDA events (emulated), cuts the block's GEMM launches out and
times them alone, and writes every figure; without a GPU and without
--emulate it says so in one line."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from blockc.codegen.cuda import toolchain

KIT = Path(__file__).parents[3] / "bench" / "gpu_kernels.py"


def _bench(name: str):
    """``bench/NAME.py`` as a module (gpu_quick imports gpu_kernels beside it)."""
    import sys
    sys.path.insert(0, str(KIT.parent))
    spec = importlib.util.spec_from_file_location(name, KIT.parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kit():
    return _bench("gpu_kernels")


@pytest.mark.skipif(toolchain.find_gxx() is None, reason="no g++: the CUDA emulator needs one")
def test_the_kit_runs_emulated_and_writes_every_figure(tmp_path, capsys):
    out = tmp_path / "kit.json"
    code = kit().main(["--emulate", "--dtypes", "float16", "--lengths", "256,1024", "--working-set-mb", "0.3",
                       "--blocks", "1", "--peak-gbps", "1", "--json", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    rows = result["row_kernels"]
    assert [(r["op"], r["row_length"]) for r in rows] == [
        ("add_layernorm", 256), ("add_layernorm", 1024), ("masked_softmax", 256), ("masked_softmax", 1024)]
    for r in rows:
        assert r["median_s"] > 0 and r["gbps"] == pytest.approx(r["bytes"] / r["median_s"] / 1e9)
        assert r["fraction_of_peak"] == pytest.approx(r["gbps"] / 1.0)
        assert ("target_met" in r) == (r["row_length"] >= 1024)
    block = result["block"]
    ops = [launch["nodes"] for launch in block["launches"]]
    assert ops[0] == ["layernorm"] and ["attention"] in ops and ["add_layernorm"] in ops
    measured = [launch for launch in block["launches"] if launch["how"] == "measured alone"]
    assert len(measured) == 4 and all(launch["nodes"][0].startswith("matmul") for launch in measured)
    assert block["roofline_s"] == pytest.approx(sum(launch["seconds"] for launch in block["launches"]))
    assert block["ratio"] == pytest.approx(block["block"]["median_s"] / block["roofline_s"])
    assert isinstance(block["target_met"], bool)
    printed = capsys.readouterr().out
    assert "| masked_softmax | float16 | 1024 |" in printed and "block / roofline" in printed


def test_without_a_gpu_the_kit_says_so(capsys):
    from blockc.runtime.cuda_runner import cuda_available
    if cuda_available()[0]:
        pytest.skip("a GPU is here: the kit runs on it")
    assert kit().main(["--blocks", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpu_kernels: error:") and "--emulate" in err and "Traceback" not in err


def test_the_kits_row_kernels_are_the_ones_a_model_fuses():
    # Each dtype the row kernels generate, and the causal softmax as a traced
    # gpt2 block fuses it in that dtype (its fill is the dtype's lowest value).
    import blockc
    bench = kit()
    for dtype in ("float32", "float16", "bfloat16"):
        model = blockc.build_model("gpt2-block", {"d_model": "32", "heads": "2", "dtype": dtype})
        fused = blockc.optimize(blockc.trace(model), disable=["fuse_attention"]).graph
        softmax = next(n for n in fused.nodes if n.op == "masked_softmax")
        graph, _, _ = bench.row_case("masked_softmax", dtype, 256, 1 << 16)
        assert graph.nodes[0].attrs["fill"] == softmax.attrs["fill"], dtype
        assert graph.inputs[0].dtype == softmax.outputs[0].dtype


# ---- bench/gpu_quick.py: the kit for one lent slot --------------------------------------------

def quick():
    return _bench("gpu_quick")


@pytest.mark.skipif(toolchain.find_gxx() is None, reason="no g++: the CUDA emulator needs one")
def test_the_quick_kit_runs_emulated_and_writes_one_json(tmp_path, capsys):
    out = tmp_path / "quick.json"
    code = quick().main(["--emulate", "--json", str(out)])
    result = json.loads(out.read_text())
    assert result["schema"] == "blockc.gpu-quick/1" and result["emulated"] is True
    checks = {c["check"]: c for c in result["preflight"]}
    if toolchain.find_nvcc().path is None:      # the preflight stops the kit, saying why
        assert code == 2 and not checks["nvcc and its headers are one CUDA"]["ok"]
        return
    assert code == 0 and checks["nvcc and its headers are one CUDA"]["ok"]
    assert [(r["op"], r["dtype"], r["row_length"]) for r in result["row_kernels"]] == [
        ("add_layernorm", "float16", 256), ("masked_softmax", "float16", 256)]
    attention = result["attention"]
    assert attention["shape"] == [1, 1, 64, 64] and attention["median_s"] > 0
    assert attention["max_abs_error"] < 2e-3 * max(1.0, attention["max_abs_reference"])   # fp16 against float64
    assert result["block"]["model"] == "gpt2-block" and result["block"]["median_s"] > 0
    assert "wrote" in capsys.readouterr().out


def test_the_quick_kits_preflight_refuses_a_driver_older_than_the_toolkit(monkeypatch):
    if toolchain.find_nvcc().path is None:
        pytest.skip("no nvcc")
    kit = quick()
    major = toolchain.find_toolkit().version[0]
    monkeypatch.setattr(kit, "driver_version", lambda: (major - 1, 8))
    checks = kit.preflight(emulated=False)
    assert checks[-1]["check"] == "the driver runs the toolkit's release" and not checks[-1]["ok"]
    assert f"driver CUDA {major - 1}.8, toolkit CUDA {major}." in checks[-1]["detail"]
    assert f"install a driver for CUDA {major}.0 or later" in checks[-1]["detail"]
    monkeypatch.setattr(kit, "driver_version", lambda: (major, 0))
    assert [c["ok"] for c in kit.preflight(emulated=False)] == [True, True, toolchain.toolkit_or_none() is not None
                                                                and _has_cublas()]


def _has_cublas() -> bool:
    try:
        toolchain.find_cublas()
        return True
    except toolchain.ToolchainError:
        return False
