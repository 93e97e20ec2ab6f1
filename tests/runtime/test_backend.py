"""The backend interface: a backend is one class and one ``register`` call,
and then ``blockc run``, ``blockc check`` and ``blockc compare`` use it with
no other edit; availability says why not; the registry is the one place
names are dispatched on."""
from __future__ import annotations

import numpy as np
import pytest

import blockc
from blockc.cli import main
from blockc.compare import CompareOptions, plan_comparison, run_comparison
from blockc.errors import BlockcError
from blockc.runtime.backend import (Backend, Compiled, CompileHints, backend_names, backend_options, check_distinct,
                                    compare_backends, make_backend, register, split_options, unregister)
from blockc.runtime.reference import run_reference
from blockc.runtime.timing import Timing

SMALL = ["d_model=32", "heads=2", "layers=1", "vocab=61", "max_positions=64"]
QUICK = dict(warmup=1, min_repeats=2, min_time_s=0.0, kernels=False)


# ---- a new backend, defined here and nowhere else --------------------------------------
class NumpyTwin(Backend):
    """The reference interpreter in float32, as a backend of its own. Option
    ``own_clock``: time itself (as a GPU backend does) instead of being timed
    around ``run``."""

    variants = ("a", "b")

    def __init__(self, *, own_clock: bool = False):
        self.own_clock = own_clock
        self.compiled: list[str] = []

    @property
    def clock(self):
        return "the twin's own clock" if self.own_clock else super().clock

    @property
    def title(self):
        return "the numpy twin"

    def detail(self, threads):
        return "numpy, twice over"

    def compile(self, graph, weights, *, variant=None, threads=None, count_kernels=False):
        self.compiled.append(variant)
        twin = Compiled(lambda feeds: run_reference(graph, weights, feeds, float64=False), kernels=len(graph.nodes))
        if self.own_clock:
            twin.times_itself = True
            twin.time = lambda feeds, **kw: Timing.of([1e-3, 2e-3, 3e-3])
        return twin


class Nowhere(Backend):
    def availability(self):
        return False, "it needs a machine that does not exist"


@pytest.fixture
def twin():
    register("numpy-twin", NumpyTwin)
    register("numpy-twin-clocked", NumpyTwin, own_clock=True)
    register("nowhere", Nowhere)
    yield
    for name in ("numpy-twin", "numpy-twin-clocked", "nowhere"):
        unregister(name)


def test_run_uses_a_registered_backend(twin, capsys):
    assert main(["run", "tiny", "--backend", "numpy-twin", "--check", "--dim", "seq=7"]) == 0
    out = capsys.readouterr().out
    assert "on the numpy twin, batch=2, seq=7" in out
    errors = [float(line.split()[-1]) for line in out.splitlines()[2:] if line.strip()]
    assert errors and max(errors) < 1e-4


def test_check_uses_a_registered_backend(twin, capsys):
    assert main(["check", "tiny", "--backend", "numpy-twin"]) == 0
    out = capsys.readouterr().out
    # --fused-as all does not change this backend: it is checked once
    assert out.count("numeric A/B on numpy-twin") == 1 and out.strip().endswith("PASS")


def test_compare_uses_a_registered_backend(twin):
    plan = plan_comparison(CompareOptions(model="tiny", settings=SMALL, backends=("numpy-twin", "numpy-twin-clocked",
                                                                                  "nowhere"),
                                          peers=(), seqs=(8,), threads=1, **QUICK))
    report = run_comparison(plan)
    rows = {(r["backend"], r["variant"], r["form"]): r for r in report["results"]}
    assert set(rows) == {(b, v, f) for b in ("numpy-twin", "numpy-twin-clocked") for v in ("a", "b")
                         for f in ("decomposed", "standard", "fused")}
    assert all(r["status"] == "ok" and r["max_abs_error"] < 1e-4 for r in rows.values())
    assert rows[("numpy-twin", "a", "fused")]["kernels"] < rows[("numpy-twin", "a", "standard")]["kernels"]
    # a backend that times itself is not timed around run(): its own samples are the row's
    assert rows[("numpy-twin-clocked", "b", "fused")]["latency_ms"]["median"] == pytest.approx(2.0)
    assert "the twin's own clock" in report["timing"]["clock"]
    nowhere = next(b for b in report["backends"] if b["name"] == "nowhere")
    assert not nowhere["available"] and nowhere["reason"] == "it needs a machine that does not exist"


def test_generate_runs_a_registered_backend_that_takes_no_hints(twin):
    """The twin's ``compile`` declares no ``hints`` (it was written before
    them): generation runs on it, and picks what the reference picks."""
    from blockc.frontends import build_model, init_weights
    from blockc.generate import generate
    model = build_model("tiny", {"layers": "1"})
    weights = init_weights(model, seed=3)
    got = generate(model, weights, [[5, 17, 9]], 3, backend="numpy-twin")
    assert got.tokens == generate(model, weights, [[5, 17, 9]], 3, backend="reference").tokens


def test_hints_reach_only_a_backend_that_declares_them():
    seen = []

    class Hinted(NumpyTwin):
        def compile(self, graph, weights, *, hints=CompileHints(), **options):
            seen.append(hints)
            return super().compile(graph, weights, **options)
    graph, hints = blockc.trace(blockc.build_model("tiny", {"layers": "1"})), CompileHints(rows=1)
    class Wrapped(Hinted):   # a wrapper that passes every keyword on (a spy, a timer) still hands hints on
        def compile(self, graph, weights, **options):
            return super().compile(graph, weights, **options)
    Hinted().compile_hinted(graph, {}, hints, variant="a").close()
    NumpyTwin().compile_hinted(graph, {}, hints, variant="a").close()   # no hints keyword: none given
    Wrapped().compile_hinted(graph, {}, hints, variant="a").close()
    assert seen == [hints, hints]


def test_an_unavailable_backend_says_why(twin, capsys):
    assert main(["run", "tiny", "--backend", "nowhere"]) == 2
    err = capsys.readouterr().err
    assert "--backend nowhere cannot run here: it needs a machine that does not exist" in err
    assert "Traceback" not in err


def test_registry_lists_names_once():
    names = backend_names()
    assert names[:6] == ("reference", "ort", "ort-cpu", "ort-cuda", "cuda", "cuda-emu")
    assert compare_backends() == ("reference", "ort-cpu", "ort-cuda", "cuda")
    with pytest.raises(BlockcError, match="unknown backend 'tpu'; backends: reference, ort"):
        make_backend("tpu")


# A value for each option a built-in backend declares, and a misspelt one.
OPTION_VALUES = {"provider": "cuda", "fused_as": "contrib", "gemm": "tiled", "tf32": True, "float64": True,
                 "compile": True, "sanitize": "address", "fused_ass": "contrib"}


def every_option() -> set[str]:
    """Every option some backend's class takes (those a registration fixes
    included), and ``fused_ass``, which none does."""
    from blockc.runtime.backend import registrations
    return {"fused_ass"}.union(*(entry.cls.option_names() for entry in registrations()))


@pytest.mark.parametrize("name", backend_names())
def test_an_option_a_backend_does_not_take_is_refused_naming_both(name):
    """Every backend, every option it does not take (``ort-cpu``'s fixed
    provider, ``float64`` on ONNX Runtime, a misspelt ``fused_ass``): once
    ignored, the backend running as if it had not been given."""
    not_taken = sorted(every_option() - backend_options(name))
    assert not_taken
    for option in not_taken:
        with pytest.raises(BlockcError, match=f"^backend '{name}' does not take the option '{option}' ") as info:
            make_backend(name, **{option: OPTION_VALUES.get(option, True)})
        assert "\n" not in str(info.value)
    for option in backend_options(name):   # and every one it takes is taken
        make_backend(name, **{option: OPTION_VALUES.get(option, True)})


def test_the_refusal_says_who_takes_the_option():
    with pytest.raises(BlockcError, match=r"^backend 'ort-cpu' does not take the option 'fused_ass' \(no backend "
                                          r"takes it\); its options: fused_as$"):
        make_backend("ort-cpu", fused_ass="contrib")
    with pytest.raises(BlockcError, match=r"^backend 'ort-cpu' does not take the option 'provider' \('ort-cpu' "
                                          r"fixes provider='cpu'; ort takes it\); its options: fused_as$"):
        make_backend("ort-cpu", provider="cuda")
    with pytest.raises(BlockcError, match=r"'cuda-emu' does not take the option 'tf32' \(cuda takes it\)"):
        make_backend("cuda-emu", tf32=True)
    ort = make_backend("ort-cpu", fused_as="contrib")
    assert (ort.name, ort.provider, ort.fused_as) == ("ort-cpu", "cpu", "contrib")
    assert ort.label == "ort (cpu, --fused-as contrib)"
    assert make_backend("reference", float64=True).title == "reference interpreter (float64)"


def test_several_backends_share_options_each_taking_its_own():
    assert split_options(["reference", "ort"], {"provider": "cpu", "float64": True}) == \
        {"reference": {"float64": True}, "ort": {"provider": "cpu"}}
    with pytest.raises(BlockcError, match=r"^backends 'reference', 'cuda-emu' do not take the option 'provider' "
                                          r"\(ort takes it\)$"):
        split_options(["reference", "cuda-emu"], {"provider": "cuda"})
    with pytest.raises(BlockcError, match="backend 'reference' does not take the option 'fused_as'"):
        plan_comparison(CompareOptions(model="tiny", backends=("reference",), fused_as="contrib", peers=()))


@pytest.mark.parametrize("names, options, same", [
    (("ort", "ort-cpu"), {}, "ort and ort-cpu"),   # ort's provider is cpu by default
    (("reference", "ort-cuda", "ort"), {"ort": {"provider": "cuda"}}, "ort-cuda and ort"),
    (("ort", "ort-cpu"), {"ort": {"fused_as": "contrib"}, "ort-cpu": {"fused_as": "contrib"}}, "ort and ort-cpu"),
])
def test_one_backend_under_two_names_is_refused(names, options, same):
    with pytest.raises(BlockcError, match=rf"^--backends names {same}, which are one backend \(ONNX Runtime "
                                          rf"\(\w+, fused ops as \w+\)\): each is measured once, name it once$"):
        check_distinct(names, options, flag="--backends")


@pytest.mark.parametrize("names, options", [
    (("ort", "ort-cuda"), {}), (("ort", "ort-cpu"), {"ort": {"provider": "cuda"}}),
    (("ort", "ort-cpu"), {"ort": {"fused_as": "contrib"}}), (("torch-eager", "torch-compile"), {}),
    (("cuda", "cuda-emu"), {}), (("reference", "ort-cpu", "ort-cuda", "cuda"), {}),
])
def test_backends_that_differ_are_not_refused(names, options):
    check_distinct(names, options, flag="--backends")


def test_the_rule_follows_the_registry(twin):
    check_distinct(["numpy-twin", "numpy-twin-clocked"], {}, flag="--backends")   # own_clock fixed: not the same
    register("numpy-twin-again", NumpyTwin)
    try:
        with pytest.raises(BlockcError, match="numpy-twin and numpy-twin-again, which are one backend"):
            check_distinct(["numpy-twin", "numpy-twin-again"], {}, flag="--backends")
    finally:
        unregister("numpy-twin-again")


def test_cuda_without_a_gpu_points_at_the_emulator():
    cuda = make_backend("cuda")
    ok, why = cuda.availability()
    if ok:
        pytest.skip("a GPU is here")
    with pytest.raises(BlockcError, match="needs a GPU: .*--backend cuda-emu"):
        cuda.require()


def _tiny():
    model = blockc.build_model("tiny", {"layers": "1"})
    rng = np.random.default_rng(0)
    feeds = {s.name: s.sample({"batch": 1, "seq": 5}, rng) for s in model.inputs()}
    return blockc.to_form(blockc.trace(model), "fused"), dict(blockc.init_weights(model)), feeds


@pytest.mark.parametrize("name", ["reference", "ort-cpu", "torch-eager"])
def test_every_host_backend_runs_and_times(name):
    backend = make_backend(name)
    if not backend.availability()[0]:
        pytest.skip(backend.availability()[1])
    graph, weights, feeds = _tiny()
    ref = run_reference(graph, weights, feeds)
    with backend.compile(graph, weights, threads=1) as compiled:
        out = compiled.run(feeds)
        t = compiled.time(feeds, warmup=1, min_repeats=3, min_time_s=0.0)
    assert max(float(np.max(np.abs(out[k] - ref[k]))) for k in ref) < 1e-4
    assert t.repeats == 3 and t.min_s <= t.median_s <= t.max_s and not compiled.times_itself


@pytest.mark.parametrize("name", ["reference", "ort-cpu", "torch-eager", "cuda-emu"])
def test_feeds_are_checked_once_at_the_boundary_not_inside_the_timing(name, monkeypatch):
    """``run`` checks every call; ``runner`` and ``time`` check once, so the
    latency compare reports is the run's, not the check's (an id scan)."""
    import blockc.runtime.bindings as bindings
    backend = make_backend(name)
    if not backend.availability()[0]:
        pytest.skip(backend.availability()[1])
    graph, weights, feeds = _tiny()
    checks, real = [], bindings.input_problems

    def counted(*args):
        checks.append(1)
        yield from real(*args)
    monkeypatch.setattr(bindings, "input_problems", counted)
    with backend.compile(graph, weights, threads=1) as compiled:
        first = compiled.run(feeds)
        compiled.run(feeds)
        assert len(checks) == 2
        run = compiled.runner(feeds)
        assert len(checks) == 3
        for _ in range(3):
            out = run()
        assert len(checks) == 3 and all(np.array_equal(out[k], first[k]) for k in first)
        compiled.time(feeds, warmup=1, min_repeats=3, min_time_s=0.0)
        assert len(checks) == 4
        with pytest.raises(BlockcError, match="ids out of range"):   # a runner of a bad feed is never made
            compiled.runner({"input_ids": feeds["input_ids"] + 1000})


def test_emulated_cuda_times_itself_in_its_child_process():
    """The child runs blockc's one timing loop (runtime.timing.measure):
    per-run times there, not around a process start."""
    from blockc.codegen.cuda import toolchain
    if toolchain.find_gxx() is None:
        pytest.skip("no g++: the CUDA emulator needs one")
    g = blockc.parse_graph("graph g(%x: f32[n,8]) {\n  %0:f32[n,8] = tanh %x\n  return y=%0\n}\n")
    x = np.linspace(-2, 2, 24, dtype=np.float32).reshape(3, 8)
    backend = make_backend("cuda-emu")
    assert backend.times_itself
    with backend.compile(g, {}) as compiled:
        np.testing.assert_allclose(compiled.run({"x": x})["y"], np.tanh(x), rtol=1e-6, atol=1e-6)
        t = compiled.time({"x": x}, warmup=1, min_repeats=4, min_time_s=0.0)
    assert compiled.times_itself and t.repeats == 4
    assert t.max_s < 0.05   # a process start alone takes longer: the time is the run's


def test_a_bad_feed_fails_before_compiling():
    class Counting(NumpyTwin):
        pass
    backend = Counting()
    graph, weights, feeds = _tiny()
    with pytest.raises(BlockcError):
        backend.run(graph, weights, {"input_ids": feeds["input_ids"].astype(np.float32)})
    assert backend.compiled == []


def test_close_releases_what_the_run_function_holds():
    """A wrapped runtime (a session in the run function's closure) is freed
    when the compiled graph is closed, even while the caller still holds it:
    compare keeps the last group's objects in scope while preparing the next."""
    import gc
    import weakref

    class Session:
        def run(self, feeds):
            return {"y": feeds["x"]}

    session = Session()
    alive = weakref.ref(session)
    compiled = Compiled(session.run)
    del session
    assert compiled.run({"x": np.ones(2)})["y"].shape == (2,)
    compiled.close()
    gc.collect()
    assert alive() is None
    with pytest.raises(BlockcError, match="closed"):
        compiled.run({"x": np.ones(2)})


@pytest.mark.parametrize("backend", ["reference", "torch-eager"])
def test_missing_or_misshapen_weights_are_refused_alike(backend):
    from blockc.errors import WeightsError
    from blockc.runtime.backend import make_backend
    b = make_backend(backend)
    ok, why = b.availability()
    if not ok:
        pytest.skip(why)
    model = blockc.build_model("tiny", {"layers": "1", "d_model": "32", "heads": "2", "vocab": "61"})
    graph, weights = blockc.trace(model), dict(blockc.init_weights(model))
    feeds = {"input_ids": np.zeros((1, 2), np.int64)}
    with pytest.raises(WeightsError) as info:
        b.run(graph, {k: v for k, v in weights.items() if k != "tok.weight"}, feeds)
    assert str(info.value) == "no weights for 1 parameter(s): tok.weight"
    with pytest.raises(WeightsError) as info:
        b.run(graph, {**weights, "tok.weight": np.ones(3, np.float32)}, feeds)
    assert str(info.value) == "weight 'tok.weight' has shape [3], the graph expects f32[61,32]"
