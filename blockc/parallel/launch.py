"""Start the ranks of a tensor-parallel run, and make sure they all end.

``run_tp(model, tp, feeds, ...)`` starts ``tp`` processes of
``blockc.parallel.worker`` with torchrun's environment variables
(``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1``,
``MASTER_PORT``), waits for them and returns each rank's outputs. blockc
grows no transport of its own: the ranks talk through
``torch.distributed``. The run is bounded and self-stopping:

* a rank that exits with an error, or dies, stops the others at once, and
  the error names the rank and says what it printed;
* a run past ``timeout`` seconds is stopped; a rank waits at most
  ``$BLOCKC_TP_TIMEOUT`` seconds in one collective (``worker.collective_timeout``),
  so a peer that hangs ends the run then;
* the ranks meet on ``$MASTER_PORT`` where set (as under torchrun), else
  on a free port; one already in use is refused before any rank starts;
* whatever ends the wait (an error, Ctrl-C), every rank started is killed
  with its process group (torch.compile's workers too) and reaped, so no
  process outlives the call.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from ..environment import env_setting
from ..errors import LaunchError
from .rank_backend import carried_registration

MASTER_ADDR = "127.0.0.1"


def rank_backends() -> tuple[str, ...]:
    """The backends a rank runs its graph on, in the registry's order (the
    first, ``torch-eager``, is the default): every one registered as the
    PyTorch backend, since each rank is a PyTorch process (``worker.py``)
    and lowers its graph as that backend's registration says
    (``rank_model.rank_session``). Read from the registry at each call: a
    torch backend registered later is one too, and its registration travels
    to the ranks in the job (``rank_backend.py``)."""
    from ..runtime.backend import registrations
    from ..runtime.backends.pytorch import TorchBackend
    return tuple(r.name for r in registrations() if issubclass(r.cls, TorchBackend))


def check_rank_backend(name: str | None, option: str | None = None) -> str:
    """The backend a rank runs: ``name``, the first of ``rank_backends()``
    where None; one a rank does not run is refused, by name. The one check
    of it: ``Case``, ``compare --tp`` and the CLI's ``--tp`` all ask here.
    ``option``: the flag the user gave it by (``--backend``, ``--backends``),
    which the refusal then tells them to give again."""
    ranks = rank_backends()
    if name is None:
        return ranks[0]
    if name not in ranks:
        fix = f"give {option}" if option else "its backend is"
        raise LaunchError(f"a tensor-parallel rank runs on PyTorch: {fix} {' or '.join(ranks)}, not {name!r}")
    return name


def free_port() -> int:
    with socket.socket() as s:
        s.bind((MASTER_ADDR, 0))
        return s.getsockname()[1]


def master_port() -> int:
    """The port the ranks meet on: ``$MASTER_PORT`` where set, as torchrun
    reads it, else a free one."""
    port = env_setting("MASTER_PORT", int, None, "a port number (1 to 65535)", LaunchError)
    return free_port() if port is None else port


def check_port(port: int) -> None:
    """Refuse a port another process holds: the ranks would meet the wrong store, or none."""
    if not 0 < port < 65536:
        raise LaunchError(f"MASTER_PORT {port} is not a port number (1 to 65535)")
    with socket.socket() as s:
        try:
            s.bind((MASTER_ADDR, port))
        except OSError:
            raise LaunchError(f"port {port} on {MASTER_ADDR} is already in use: pick a free MASTER_PORT "
                              f"or leave it to blockc") from None


def rank_environ(rank: int, world: int, port: int) -> dict[str, str]:
    """torchrun's variables for ``rank`` on this machine."""
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": MASTER_ADDR, "MASTER_PORT": str(port)}


@dataclass
class Case:
    """One model run on the ranks: a built-in name or a ``.py``/``.onnx``
    spec with its ``--set`` overrides, weights from ``seed`` or a
    ``.safetensors`` file, the vocabulary padded to divide (``pad_vocab``),
    the per-rank graphs ``fused`` or not, run on ``backend`` (one of
    ``rank_backends()``, the first where none is given; checked here) ``repeat`` times, or
    generating (``generate``: ``generate_tp``'s request)."""
    model: str
    feeds: Mapping[str, np.ndarray]
    overrides: Mapping[str, str] = field(default_factory=dict)
    seed: int = 0
    weights: str | None = None
    pad_vocab: bool = False
    fused: bool = False
    backend: str | None = None
    repeat: int = 1
    generate: dict | None = None
    # the backend's registration as the job carries it to the ranks (``rank_backend``): made once, here
    registration: dict = field(init=False, repr=False)

    def __post_init__(self):
        self.backend = check_rank_backend(self.backend)
        # one a rank could not register again is refused before any starts
        self.registration = carried_registration(self.backend)


def run_tp(model: str, tp: int, feeds: Mapping[str, np.ndarray], **options) -> list[dict[str, np.ndarray]]:
    """Run ``model`` split over ``tp`` ranks on ``feeds``; each rank's
    outputs. ``options``: ``Case``'s fields, and ``run_cases``' own."""
    launch = {k: options.pop(k) for k in ("timeout", "port", "on_start") if k in options}
    return run_cases([Case(model, feeds, **options)], tp, **launch)[0]


def run_cases(cases: list[Case], tp: int, *, timeout: float = 120.0, port: int | None = None,
              on_start: Callable[[list, str], None] | None = None) -> list[list[dict[str, np.ndarray]]]:
    """Several models in one launch (one process group, started once):
    ``result[case][rank]`` is a rank's outputs. ``on_start(processes,
    folder)`` is called once every rank has started (a test kills one)."""
    from ..runtime.feeds import load_npz
    return _launch(cases, tp, timeout, port, on_start,
                   lambda path: load_npz(path + ".npz"))


def time_cases(cases: list[Case], tp: int, *, blocks: int = 5, rounds: int = 2, warmup: int = 2, repeats: int = 4,
               seed: int = 1, control: str, timeout: float = 600.0, port: int | None = None) -> list[list[dict]]:
    """Each case's step on ``tp`` ranks beside the same on one, timed in
    ``blocks`` blocks of fresh sessions (``parallel/rank_timing.py``):
    ``result[case][rank]`` is that rank's ``{"blocks": [{key: {"samples",
    "round_medians"}}], "collectives_s", "collectives", "split": outputs}``,
    and on rank 0 ``"one"``: the one-rank session's outputs. ``control``:
    the key suffix of the A/A control, a second one-rank session of the
    standard form (compare's ``AA``)."""
    from ..runtime.feeds import load_npz

    def read(path: str) -> dict:
        with open(path + ".timing.json") as f:
            timed = json.load(f)
        one = load_npz(path + ".one.npz") if os.path.exists(path + ".one.npz") else None
        return {**timed, "split": load_npz(path + ".npz"), "one": one}
    timing = {"blocks": blocks, "rounds": rounds, "warmup": warmup, "repeats": repeats, "seed": seed,
              "control": control}
    return _launch(cases, tp, timeout, port, None, read, timing=timing)


def generate_tp(model: str, tp: int, prompts: list, max_new: int, *, pick=None, stop_id=None, stopping=(),
                on_token=None, form: str = "fused", cache: str = "inplace", cache_len: int | None = None,
                backend: str | None = None, overrides: Mapping[str, str] | None = None, seed: int = 0,
                weights: str | None = None, pad_vocab: bool = False, timeout: float = 300.0,
                port: int | None = None) -> list:
    """``generate`` (``generate/loop.py``) with the model split over ``tp``
    ranks: each rank's ``Generation``. Rank 0 runs ``pick`` (greedy unless
    given), ``stop_id`` and ``stopping``, sent to it by pickle, and the
    others take its picks (``generate/agreement.py``), so all ranks hold the
    same tokens. ``on_token(tokens)`` is called here with each prompt's new
    ids so far, as rank 0 writes them after its steps (read every 50 ms, so
    steps may come together), and with the last. ``form``, ``cache``,
    ``cache_len``: as ``generate``'s; the ranks run on ``backend`` (``Case``)."""
    from ..generate.loop import Generation
    choices = {"stop_id": stop_id, "stopping": list(stopping), **({"pick": pick} if pick is not None else {})}
    case = Case(model, {}, overrides=dict(overrides or {}), seed=seed, weights=weights, backend=backend,
                pad_vocab=pad_vocab,
                generate={"prompts": [list(map(int, p)) for p in prompts], "max_new": int(max_new), "form": form,
                          "cache": str(getattr(cache, "value", cache)), "cache_len": cache_len,
                          "choices": _pickled(choices)})
    read = lambda path: json.load(open(path + ".generation.json"))   # noqa: E731
    watch = _token_watch(on_token) if on_token is not None else None
    return [Generation.from_json(g) for g in _launch([case], tp, timeout, port, None, read, watch)[0]]


def _token_watch(on_token):
    """A ``_wait`` watch that hands ``on_token`` rank 0's tokens each time they change."""
    seen = []

    def watch(folder: str) -> None:
        try:
            with open(os.path.join(folder, "case0.rank0.tokens.json")) as f:
                tokens = json.load(f)
        except (OSError, ValueError):   # not written yet
            return
        if tokens != seen:
            seen[:] = tokens
            on_token(tokens)
    return watch


def _pickled(choices: dict) -> bytes:
    """The pick and stopping criteria as rank 0 will read them, refused here if they cannot travel."""
    import pickle
    try:
        return pickle.dumps(choices)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        raise LaunchError(f"the pick and stopping criteria go to rank 0 as a pickle, and one of them cannot be "
                          f"pickled ({e}): define it at a module's top level") from None


def _launch(cases, tp, timeout, port, on_start, read, watch=None, timing=None) -> list[list]:
    from .worker import collective_timeout
    collective_timeout()   # a malformed $BLOCKC_TP_TIMEOUT, refused before any rank starts
    _check_shards(cases, tp)
    port = master_port() if port is None else port
    check_port(port)
    with tempfile.TemporaryDirectory(prefix="blockc-tp-") as folder:
        write_job(cases, folder, timeout, timing)
        procs = _start(folder, tp, port)
        try:
            if on_start is not None:
                on_start(procs, folder)
            _wait(procs, folder, timeout, watch)
        finally:
            stop(procs)
        return [[read(os.path.join(folder, f"case{i}.rank{r}")) for r in range(tp)] for i in range(len(cases))]


def write_job(cases: list[Case], folder: str, timeout: float = 120.0, timing: dict | None = None) -> str:
    """``folder/job.json`` and the feeds it names: what each rank reads
    (``parallel/worker.py``), whoever starts the ranks, blockc or torchrun; the
    ranks write their outputs into ``folder`` (made if it is not there) too. ``timing``: the cases timed
    (``time_cases``) rather than run. Returns the job's path."""
    from ..runtime.feeds import save_npz
    os.makedirs(folder, exist_ok=True)   # the README's ``write_job([...], "job")`` names a folder not yet made
    job = {"out": os.path.abspath(folder), "timeout": timeout, "cases": [], **({"time": timing} if timing else {})}
    for i, case in enumerate(cases):
        spec = {k: v for k, v in vars(case).items() if k != "feeds"}
        spec["feeds"], spec["overrides"] = os.path.join(job["out"], f"feeds{i}.npz"), dict(case.overrides)
        save_npz(spec["feeds"], case.feeds)
        if case.generate is not None:   # the pick and criteria (``generate_tp``) beside the job, by pickle
            spec["generate"] = {**case.generate, "choices": os.path.join(job["out"], f"choices{i}.pkl")}
            with open(spec["generate"]["choices"], "wb") as f:
                f.write(case.generate["choices"])
        job["cases"].append(spec)
    path = os.path.join(folder, "job.json")
    with open(path, "w") as f:
        json.dump(job, f)
    return path


def _check_shards(cases: list[Case], tp: int) -> None:
    """Shard here first: what does not divide, or weights no rank can read
    in slices, are refused before any rank starts. Each model once, however
    many cases run it (compare --tp's backends and forms)."""
    from .rank_model import check_weights_file, model_key, sharded_model
    for case in cases:
        if case.weights is not None:
            check_weights_file(case.weights)
    for key in dict.fromkeys(model_key(case.model, case.overrides, case.pad_vocab) for case in cases):
        sharded_model(key, tp)


def _start(folder: str, tp: int, port: int) -> list[subprocess.Popen]:
    procs = []
    try:
        for rank in range(tp):
            # one thread per rank unless told otherwise, as torchrun does: ranks whose thread pools
            # spin against each other's on shared cores make a step hundreds of times slower
            env = {"OMP_NUM_THREADS": "1", **os.environ, **rank_environ(rank, tp, port),
                   "PYTHONPATH": _this_blockc_first()}
            err = open(os.path.join(folder, f"stderr.rank{rank}"), "w")
            procs.append(subprocess.Popen([sys.executable, "-m", "blockc.parallel.worker",
                                           os.path.join(folder, "job.json")], env=env, stdout=subprocess.DEVNULL,
                                          stderr=err, start_new_session=True))
            err.close()
    except BaseException:
        stop(procs)
        raise
    return procs


def _this_blockc_first() -> str:
    """The ranks import the blockc that launched them, whatever is installed."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.pathsep.join([here] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


def _wait(procs: list, folder: str, timeout: float, watch: Callable[[str], None] | None = None) -> None:
    """Until every rank has ended well; the first that fails, or the clock,
    ends the run. ``watch(folder)`` is called at every look, and once after
    the last (a caller following what the ranks write as they go)."""
    deadline = time.monotonic() + timeout
    while True:
        if watch is not None:
            watch(folder)
        codes = [p.poll() for p in procs]
        failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            rank = min(failed, key=lambda r: (codes[r] >= 0, r))   # one killed is the cause, not its peers
            raise LaunchError(f"rank {rank} of {len(procs)} {_how(codes[rank])}: {_said(folder, rank)}; "
                              f"the other ranks were stopped")
        if all(c == 0 for c in codes):
            if watch is not None:
                watch(folder)
            return
        if time.monotonic() > deadline:
            raise LaunchError(f"the {len(procs)} ranks did not finish within {timeout:g} s; they were stopped")
        time.sleep(0.05)


def _how(code: int) -> str:
    if code < 0:
        return f"died ({signal.Signals(-code).name})"
    return f"exited with code {code}"


def _said(folder: str, rank: int) -> str:
    try:
        with open(os.path.join(folder, f"stderr.rank{rank}")) as f:
            lines = [ln.strip() for ln in f if ln.strip()]
    except OSError:
        lines = []
    errors = [ln for ln in lines if ln.startswith("blockc: error:")]
    return (errors or lines or ["it printed nothing"])[-1]


def stop(procs: list) -> None:
    """Kill every rank's process group and reap it (idempotent)."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        # a rank's own children (torch.compile's workers) share its group: kill what is left of it
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
