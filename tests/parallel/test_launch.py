"""Tensor parallelism run for real: ranks started as processes, talking
through torch.distributed (gloo on the CPU), each rank's graph lowered by
the PyTorch backend. Outputs must equal the unsharded model's on the same
backend; a dead rank, a taken port and Ctrl-C must end every rank, bounded
in time, with one clear error."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from registry_testing import registered_torch_backend

from blockc.frontends import build_model, init_weights, trace
from blockc.errors import ShardError
from blockc.errors import LaunchError
from blockc.parallel.launch import Case, run_cases, run_tp

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("this torch has no gloo process group", allow_module_level=True)

# the issue's vocabularies: gpt2's 50257 padded to split (pad_vocab), bert-base's 30522 splits as it is; narrow
# (d_model=64), since no split depends on the width and every rank makes the whole model's seeded weights per case
NARROW = {"layers": "2", "d_model": "64", "heads": "4"}
MODELS = {"gpt2": NARROW, "bert-base": NARROW, "llama-tiny": {}, "qwen3-tiny": {}}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def feeds_for(name: str, overrides: dict, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {s.name: s.sample({"batch": 2, "seq": 5}, rng) for s in build_model(name, overrides).inputs()}


def unsharded(name: str, overrides: dict, feeds: dict) -> dict:
    from blockc.runtime.torch_runner import run_torch
    model = build_model(name, overrides)
    return run_torch(trace(model), init_weights(model, seed=0), feeds)   # an ONNX file's own weights


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:   # a zombie is gone too, only not yet reaped
        return f.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.long
def test_tp2_on_gloo_equals_the_unsharded_model_fused_and_unfused(tmp_path):
    from blockc.codegen.onnx_export import save_onnx
    model = build_model("llama-tiny", {"layers": "1"})
    onnx_file = str(tmp_path / "llama.onnx")
    save_onnx(trace(model), init_weights(model, seed=0), onnx_file)
    cases = [Case(name, feeds_for(name, over), overrides=over, fused=fused, pad_vocab=True)
             for name, over in {**MODELS, onnx_file: {}}.items() for fused in (False, True)]
    results = run_cases(cases, 2, timeout=300)
    wants: dict = {}   # the fused and unfused cases of a model share feeds (seed 0): its unsharded run once
    for case, ranks in zip(cases, results):
        key = (case.model, tuple(sorted(case.overrides.items())))
        if key not in wants:
            wants[key] = unsharded(case.model, dict(case.overrides), case.feeds)
        want = wants[key]
        for rank, got in enumerate(ranks):
            for out in want:
                np.testing.assert_allclose(got[out], want[out], rtol=1e-5, atol=1e-5,
                                           err_msg=f"{case.model} fused={case.fused} rank {rank} {out}")


def signal_rank_1_once_ready(sig, started: list):
    """An ``on_start`` that sends rank 1 ``sig`` once it is about to run (its processes go to ``started``)."""
    def on_start(procs, folder):
        started.extend(procs)

        def sender():
            ready = os.path.join(folder, "case0.rank1.ready")
            for _ in range(1200):
                if os.path.exists(ready):
                    break
                time.sleep(0.05)
            time.sleep(0.3)
            os.kill(procs[1].pid, sig)
        threading.Thread(target=sender, daemon=True).start()
    return on_start


def test_a_killed_rank_stops_the_others_with_a_clear_error():
    over = {"layers": "1"}
    started: list = []
    t0 = time.monotonic()
    with pytest.raises(LaunchError, match=r"rank 1 of 2 died \(SIGKILL\).*the other ranks were stopped"):
        run_tp("llama-tiny", 2, feeds_for("llama-tiny", over), overrides=over, repeat=10**7, timeout=120,
               on_start=signal_rank_1_once_ready(signal.SIGKILL, started))
    assert time.monotonic() - t0 < 100
    assert len(started) == 2 and not any(alive(p.pid) for p in started)


def test_a_hung_rank_ends_the_run_within_the_collective_timeout(monkeypatch):
    """A peer that stops answering (SIGSTOP: alive, silent) is bounded by
    $BLOCKC_TP_TIMEOUT, not by torch.distributed's 30 minutes nor the whole
    run's limit: rank 0's collective gives up and the launcher stops both."""
    monkeypatch.setenv("BLOCKC_TP_TIMEOUT", "3")
    over = {"layers": "1"}
    started: list = []
    t0 = time.monotonic()
    with pytest.raises(LaunchError, match=r"rank 0 of 2 exited with code 2: blockc: error: rank 0: .*"
                                          r"the other ranks were stopped"):
        run_tp("llama-tiny", 2, feeds_for("llama-tiny", over), overrides=over, repeat=10**7, timeout=90,
               on_start=signal_rank_1_once_ready(signal.SIGSTOP, started))
    assert time.monotonic() - t0 < 60
    assert len(started) == 2 and not any(alive(p.pid) for p in started)


def test_the_collective_timeout_is_read_and_checked(monkeypatch):
    from blockc.errors import BlockcError
    from blockc.parallel.worker import DEFAULT_COLLECTIVE_TIMEOUT_S, collective_timeout
    monkeypatch.delenv("BLOCKC_TP_TIMEOUT", raising=False)
    assert collective_timeout() == DEFAULT_COLLECTIVE_TIMEOUT_S <= 60
    monkeypatch.setenv("BLOCKC_TP_TIMEOUT", "2.5")
    assert collective_timeout() == 2.5
    for bad in ("soon", "0", "-1", "inf"):
        monkeypatch.setenv("BLOCKC_TP_TIMEOUT", bad)
        started: list = []
        with pytest.raises(BlockcError, match=f"BLOCKC_TP_TIMEOUT='{bad}' is not a number of seconds"):
            run_tp("llama-tiny", 2, {}, overrides={"layers": "1"}, on_start=lambda p, f: started.extend(p))
        assert not started


def test_a_port_in_use_is_refused_before_any_rank_starts():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        started: list = []
        with pytest.raises(LaunchError, match=f"port {port} on 127.0.0.1 is already in use"):
            run_tp("llama-tiny", 2, feeds_for("llama-tiny", {}), port=port, on_start=lambda p, f: started.extend(p))
        assert not started


def test_what_does_not_divide_is_refused_before_any_rank_starts():
    started: list = []
    with pytest.raises(ShardError, match="12 heads do not divide among 8 ranks"):
        run_tp("bert-base", 8, {}, overrides={"layers": "1", "vocab": "256"},
               on_start=lambda p, f: started.extend(p))
    assert not started


def test_ctrl_c_ends_every_rank():
    script = textwrap.dedent("""
        import os, sys, time
        import numpy as np
        from blockc.frontends import build_model
        from blockc.parallel.launch import run_tp
        rng = np.random.default_rng(0)
        m = build_model("llama-tiny", {"layers": "1"})
        feeds = {s.name: s.sample({"batch": 1, "seq": 4}, rng) for s in m.inputs()}
        def started(procs, folder):
            print(" ".join(str(p.pid) for p in procs), folder, flush=True)
        run_tp("llama-tiny", 2, feeds, overrides={"layers": "1"}, repeat=10**7, timeout=120, on_start=started)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env)
    try:
        *pids, folder = parent.stdout.readline().split()
        for _ in range(1200):
            if all(os.path.exists(os.path.join(folder, f"case0.rank{r}.ready")) for r in (0, 1)):
                break
            time.sleep(0.05)
        parent.send_signal(signal.SIGINT)
        _, err = parent.communicate(timeout=60)
    finally:
        parent.kill()
    assert "KeyboardInterrupt" in err
    assert not any(alive(int(p)) for p in pids)


def test_generate_on_two_ranks_gives_the_tokens_of_one(tmp_path):
    """Sampling (rank 0 draws for both), the concat cache and a weights file, as in one process."""
    from safetensors.numpy import save_file
    from blockc.generate import Sampler
    from blockc.generate.loop import generate
    from blockc.parallel.launch import generate_tp
    model = build_model("llama-tiny", {})
    weights = dict(init_weights(model, seed=5))
    save_file(weights, str(tmp_path / "w.safetensors"))
    prompts = [[5, 17, 42, 9], [100, 3]]
    want = generate(model, weights, prompts, 6, backend="torch-eager", cache="concat",
                    pick=Sampler(temperature=0.8, seed=1)).tokens
    seen: list = []
    ranks = generate_tp("llama-tiny", 2, prompts, 6, pick=Sampler(temperature=0.8, seed=1), cache="concat",
                        weights=str(tmp_path / "w.safetensors"), on_token=lambda t: seen.append([list(r) for r in t]))
    assert [g.tokens for g in ranks] == [want, want] and ranks[0].backend == "torch-eager"
    assert seen and seen[-1] == want   # streamed from rank 0, each step's tokens growing to the last
    assert all(len(a[0]) <= len(b[0]) and b[0][:len(a[0])] == a[0] for a, b in zip(seen, seen[1:]))


def test_a_pick_that_cannot_travel_to_rank_0_is_refused_before_any_rank_starts():
    from blockc.parallel.launch import generate_tp
    with pytest.raises(LaunchError, match="the pick and stopping criteria go to rank 0 as a pickle"):
        generate_tp("llama-tiny", 2, [[1, 2]], 2, pick=lambda logits, history: logits.argmax(1))


def test_a_case_carries_a_backend_a_rank_runs():
    """The backend's name travels to the ranks as it is, checked once here."""
    from blockc.parallel.launch import rank_backends
    assert rank_backends() == ("torch-eager", "torch-compile")   # the registry's torch backends, eager first
    assert [Case("gpt2", {}, backend=b).backend for b in rank_backends()] == ["torch-eager", "torch-compile"]
    assert Case("gpt2", {}).backend == "torch-eager"
    with pytest.raises(LaunchError, match="a tensor-parallel rank runs on PyTorch: its backend is torch-eager or "
                                          "torch-compile, not 'ort'"):
        Case("gpt2", {}, backend="ort")
    with pytest.raises(LaunchError, match="^a tensor-parallel rank runs on PyTorch: its backend is torch-eager or "
                                          "torch-compile, not 'ort-cpu'$"):
        Case("gpt2", {}, backend="ort-cpu")


@pytest.fixture
def torch_variant():
    """A PyTorch backend registered under a name of its own, forgotten after the test."""
    with registered_torch_backend("torch-variant") as name:
        yield name


def test_a_torch_backend_registered_later_is_one_a_rank_runs(torch_variant):
    """Which backends a rank runs is read from the registry, not typed again:
    every user of it takes a new registration of the PyTorch backend, and
    still refuses one that is not PyTorch."""
    from argparse import Namespace

    from blockc.cli.tensor_parallel import rank_backend
    from blockc.compare.tensor_parallel import check_tp_options
    from blockc.parallel.launch import rank_backends
    assert rank_backends() == ("torch-eager", "torch-compile", torch_variant)
    assert Case("gpt2", {}, backend=torch_variant).backend == torch_variant
    assert Case("gpt2", {}).backend == "torch-eager"
    assert check_tp_options([torch_variant], tp=2, blocks=1, rounds=1, warmup=0, repeats=1) == (torch_variant,)
    assert rank_backend(Namespace(backend=torch_variant)) == torch_variant
    with pytest.raises(LaunchError, match="its backend is torch-eager or torch-compile or torch-variant, "
                                          "not 'ort-cpu'"):
        Case("gpt2", {}, backend="ort-cpu")


@pytest.fixture(scope="module")
def llama_one_layer():
    """llama-tiny of one layer: its overrides, feeds and unsharded outputs (computed once)."""
    over = {"layers": "1"}
    feeds = feeds_for("llama-tiny", over)
    return over, feeds, unsharded("llama-tiny", over, feeds)


def assert_ranks_equal(ranks: list, want: dict) -> None:
    for rank, got in enumerate(ranks):
        for out in want:
            np.testing.assert_allclose(got[out], want[out], rtol=1e-5, atol=1e-5, err_msg=f"rank {rank} {out}")


def test_a_torch_backend_registered_at_run_time_runs_on_the_ranks(llama_one_layer):
    """The ranks are fresh processes that know only blockc's own backends:
    the registration travels in the job, and the ranks register it again
    (once every rank died 'unknown backend')."""
    over, feeds, want = llama_one_layer
    with registered_torch_backend("torch-eager-variant", compile=False) as name:
        ranks = run_tp("llama-tiny", 2, feeds, overrides=over, backend=name, timeout=120)
    assert_ranks_equal(ranks, want)


def test_a_users_backend_imported_from_a_folder_the_ranks_lack_runs_on_them(llama_one_layer, tmp_path,
                                                                           monkeypatch):
    """A class the launching process imports from a folder on its own path
    only (a script's folder, a notebook's sys.path) is imported by the ranks
    too: the folder travels with the registration (once every rank died
    'cannot import its class' after launch)."""
    over, feeds, want = llama_one_layer
    (tmp_path / "users_pkg").mkdir()
    (tmp_path / "users_pkg" / "__init__.py").write_text("")
    (tmp_path / "users_pkg" / "fast_torch.py").write_text(
        "from blockc.runtime.backends.pytorch import TorchBackend\n\n\nclass FastTorch(TorchBackend):\n    pass\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)   # the ranks' cwd, first on their path, does not hold it either
    monkeypatch.syspath_prepend(str(tmp_path))
    from users_pkg.fast_torch import FastTorch
    try:
        with registered_torch_backend("torch-users", cls=FastTorch, compile=False) as name:
            ranks = run_tp("llama-tiny", 2, feeds, overrides=over, backend=name, timeout=120)
    finally:
        for module in ("users_pkg.fast_torch", "users_pkg"):
            sys.modules.pop(module, None)
    assert_ranks_equal(ranks, want)


def test_a_backend_a_rank_cannot_import_is_refused_before_any_rank_starts():
    from blockc.runtime.backends.pytorch import TorchBackend

    class Local(TorchBackend):   # a function's own class: no fresh interpreter finds it by name
        pass
    started: list = []
    with registered_torch_backend("torch-local", cls=Local) as name:
        with pytest.raises(LaunchError, match=r"^backend 'torch-local' is the class .*<locals>\.Local, which a "
                                              r"rank \(a fresh Python process\) cannot import by that name"):
            run_tp("llama-tiny", 2, {}, overrides={"layers": "1"}, backend=name,
                   on_start=lambda p, f: started.extend(p))
        with registered_torch_backend("torch-odd", mode=object()) as odd:
            with pytest.raises(LaunchError, match="^backend 'torch-odd' fixes the options .* which cannot travel"):
                Case("gpt2", {}, backend=odd)
    assert not started
