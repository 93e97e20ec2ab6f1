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


def kit():
    spec = importlib.util.spec_from_file_location("gpu_kernels", KIT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
