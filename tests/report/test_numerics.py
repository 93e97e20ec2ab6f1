"""Non-finite numbers never pass a check: ``check_fusions`` fails the unfused
run and names the first node whose reference result is not finite (instead
of marking it ok and blaming every fusion for a rounding accumulation), and
``blockc run --check`` exits non-zero saying the same, and where an output's
error is over the limit ``blockc check`` holds a fusion to; each fusion's
A/B runs after the fusions it builds on and reports its true site count."""
from __future__ import annotations

import numpy as np
import pytest

import blockc
from blockc.cli import main
from blockc.frontends.weights import NonFiniteWeightsWarning, materialize, save_weights
from blockc.report import numerics
from blockc.report.numerics import (FLOOR, check_fusions, error_limit, first_non_finite, format_check,
                                   max_abs_error)
from blockc.runtime.backend import Backend, Compiled, register, unregister
from blockc.runtime.reference import run_reference

SETS = {"layers": "1"}


def _nan_weights():
    model = blockc.build_model("tiny", SETS)
    weights = materialize(blockc.init_weights(model))
    weights["blocks.0.ln1.weight"][:3] = np.nan
    return model, weights


def _feeds(model):
    return {s.name: s.sample({"batch": 1, "seq": 8}, np.random.default_rng(0)) for s in model.inputs()}


def test_nan_weights_fail_the_unfused_run_and_blame_no_fusion():
    model, weights = _nan_weights()
    graph = blockc.trace(model)
    result = check_fusions(graph, weights, _feeds(model))
    assert not result.passed
    unfused = result.variants[0]
    assert unfused.name == "unfused" and not unfused.passed
    assert "not finite" in unfused.divergence and "(layernorm)" in unfused.divergence
    assert "'blocks.0.ln1.weight'" in unfused.divergence
    text = format_check(result)
    assert "rounding accumulation" not in text and "fusions not compared" in text


def test_first_non_finite_says_everything_is_finite_when_it_is():
    model = blockc.build_model("tiny", SETS)
    weights = materialize(blockc.init_weights(model))
    assert "is finite" in first_non_finite(blockc.trace(model), weights, _feeds(model))


def test_a_fusion_that_makes_nan_is_named_not_called_rounding():
    model = blockc.build_model("tiny", SETS)
    graph = blockc.trace(model)
    weights, feeds = materialize(blockc.init_weights(model)), _feeds(model)

    def run(g):   # a backend whose fused layernorm kernel is broken
        out = blockc.runtime.reference.run_reference(g, weights, feeds, float64=False)
        if any(n.op == "add_layernorm" for n in g.nodes):
            out = {k: np.full_like(v, np.nan) for k, v in out.items()}
        return out

    result = check_fusions(graph, weights, feeds, run=run, backend="mybackend")
    assert result.variants[0].passed   # the unfused run is fine
    broken = [v for v in result.variants if not v.passed]
    assert broken and all("not finite" in v.divergence and "so mybackend made the NaN/Inf" in v.divergence
                          for v in broken)


def test_run_check_fails_on_non_finite_outputs(tmp_path, capsys):
    _, weights = _nan_weights()
    path = tmp_path / "nan.safetensors"
    save_weights(path, weights)
    with pytest.warns(NonFiniteWeightsWarning, match=r"'blocks.0.ln1.weight': 3 NaN of 64 values"):
        code = main(["run", "tiny", "--set", "layers=1", "--weights", str(path), "--check",
                     "--backend", "reference"])
    err = capsys.readouterr().err
    assert code == 1
    assert "the outputs are not finite" in err and "first not finite at" in err and "(layernorm)" in err
    with pytest.warns(NonFiniteWeightsWarning):
        assert main(["check", "tiny", "--set", "layers=1", "--weights", str(path), "--backend", "reference"]) == 1
    out = capsys.readouterr().out
    assert "unfused" in out and "FAIL" in out and "rounding accumulation" not in out


def test_run_check_passes_finite_outputs(capsys):
    assert main(["run", "tiny", "--set", "layers=1", "--check", "--backend", "reference"]) == 0


class Off(Backend):
    """The reference interpreter in float32 with ``off`` added to every
    output: a backend whose numbers are wrong by a known amount."""

    def __init__(self, *, off: float = 0.0):
        self.off = off

    def compile(self, graph, weights, *, variant=None, threads=None):
        return Compiled(lambda feeds: {k: v + np.float32(self.off) for k, v in
                                       run_reference(graph, weights, feeds, float64=False).items()})


@pytest.fixture
def off():
    register("off", Off, off=1e-3)   # far over the limit: ~1e-6 for these outputs
    register("not-off", Off)
    yield
    unregister("off")
    unregister("not-off")


def _run_check(capsys, backend):
    code = main(["run", "tiny", "--set", "layers=1", "--backend", backend, "--check", "--dim", "seq=7"])
    out, err = capsys.readouterr()
    errors = {line.split()[0]: float(line.split()[-1]) for line in out.splitlines()[2:]}
    return code, errors, err


def test_run_check_fails_an_output_over_checks_limit(off, capsys):
    """Once any finite error passed: the exit status said nothing about the numbers."""
    code, errors, err = _run_check(capsys, "off")
    assert errors == pytest.approx({"logits": 1e-3, "probs": 1e-3}, rel=1e-2)
    assert code == 1 and err.count("\n") == 1
    assert err.startswith("blockc: check failed: off is further from the float64 reference than blockc check "
                          "allows: logits: max |err| 0.001 is over its limit ")
    assert "; probs: max |err| 0.001 is over" in err and f"in the graph's dtypes + {FLOOR:g})" in err


def test_run_check_passes_an_output_within_checks_limit(off, capsys):
    code, errors, err = _run_check(capsys, "not-off")   # the reference interpreter's own float32 numbers
    assert code == 0 and err == "" and 0 < errors["logits"] < 1e-5


def test_check_holds_a_fusion_to_the_same_limit():
    model = blockc.build_model("tiny", SETS)
    weights = materialize(blockc.init_weights(model))
    result = check_fusions(blockc.trace(model), weights, _feeds(model))
    unfused, fused = result.variants[0], result.variants[1]
    assert fused.limits == {k: error_limit(e) for k, e in unfused.errors.items()}


@pytest.mark.parametrize("eps", ["-1", "nan", "inf", "0"])
def test_eps_is_validated(eps, capsys):
    assert main(["run", "tiny", "--set", f"eps={eps}"]) == 2
    assert "eps must be a positive finite number" in capsys.readouterr().err


def test_a_fusion_runs_after_the_fusions_it_builds_on_and_reports_its_true_count():
    """bert-base: fuse_qkv_attention finds no site alone; after fuse_qkv and
    fuse_attention it finds one per layer, as in the whole pipeline."""
    from blockc.passes.manager import optimize
    from blockc.report.numerics import prerequisites
    model = blockc.build_model("bert-base", {"layers": "2", "d_model": "64", "heads": "4", "vocab": "50"})
    graph = blockc.trace(model)
    assert prerequisites(graph, "fuse_qkv_attention") == ("fuse_qkv", "fuse_attention")
    assert prerequisites(graph, "fuse_qkv") == () and prerequisites(graph, "fuse_add_layernorm") == ()
    weights = materialize(blockc.init_weights(model))
    feeds = {s.name: s.sample({"batch": 1, "seq": 8}, np.random.default_rng(0)) for s in model.inputs()}
    result = check_fusions(graph, weights, feeds)
    by_name = {v.name: v for v in result.variants}
    whole = sum(1 for s in optimize(graph).sites if s.fused and s.pass_name == "fuse_qkv_attention")
    assert by_name["fuse_qkv_attention"].fused_sites == whole == 2
    assert by_name["fuse_qkv_attention"].after == ("fuse_qkv", "fuse_attention")
    assert "ran after fuse_qkv, fuse_attention" in format_check(result)


def test_blockc_check_optimizes_each_set_of_fusions_once_per_graph(monkeypatch, capsys):
    """Finding each fusion's prerequisites re-ran the pipeline for sets it had
    run already, O(fusions²) times, and again for every backend checked."""
    import blockc.report.numerics as numerics
    asked = []
    real = numerics.optimize

    def counted(graph, **kw):
        asked.append(frozenset(kw.get("disable", ())))
        return real(graph, **kw)
    monkeypatch.setattr(numerics, "optimize", counted)
    assert main(["check", "tiny", "--set", "layers=1", "--backend", "reference", "--backend", "ort",
                 "--fused-as", "function"]) == 0
    assert capsys.readouterr().out.count("PASS") == 2
    assert asked and len(asked) == len(set(asked))


def test_max_abs_error_in_chunks_is_the_whole_arrays(monkeypatch):
    """Widened a chunk at a time (compare's logits are gigabytes), with the
    same answer as widening everything; a NaN anywhere is the answer, never
    dropped by ``max`` (``max(0.0, nan)`` is 0.0)."""
    monkeypatch.setattr(numerics, "_ERROR_CHUNK", 7)
    rng = np.random.default_rng(0)
    got = rng.standard_normal((5, 9)).astype(np.float32)
    ref = got.astype(np.float64) + rng.standard_normal((5, 9)) * 1e-3
    assert max_abs_error(got, ref) == float(np.max(np.abs(got.astype(np.float64) - ref)))
    assert max_abs_error(got[:, ::2], ref[:, ::2]) == float(np.max(np.abs(got[:, ::2] - ref[:, ::2])))
    got[4, 8] = np.nan     # in the last chunk, after the largest error
    assert np.isnan(max_abs_error(got, ref))
    assert max_abs_error(np.zeros((0, 3), np.float32), np.zeros((0, 3))) == 0.0
