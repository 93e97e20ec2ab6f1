"""The ``blockc`` command line."""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from .errors import BlockcError

EXAMPLES = """\
examples:
  blockc compare                                  # the default gpt2 block: every form, backend and peer
  blockc compare gpt2 --set layers=2 --batch 1,8 --seq 128,512 --json r.json --report out/
  blockc models
  blockc show tiny --form decomposed
  blockc show tiny --form fused --disable fuse_attention --print-after fuse_masked_softmax
  blockc fusions gpt2 --set layers=4 --json report.json
  blockc check bert-base --set layers=2
  blockc cuda gpt2 --set layers=2 -o build/gpt2-cuda
  blockc run tiny --backend cuda-emu --check
  blockc export gpt2 --set layers=2 -o gpt2-2l.onnx
  blockc run bert-base --set layers=2 --backend ort --check
  blockc run my_model.py:build --dim seq=64
  blockc run tiny --inputs ids.npz --save out.npz   # your arrays in (numpy.savez), the outputs out
  blockc export gpt2 --fused-as function -o f.onnx  # --fused-as alone means --form fused
  blockc generate llama-tiny --prompt-ids 1,2,3 --prompt-ids 4,5 --max-new 16
"""


# ---- options ------------------------------------------------------------------
# Each option that several commands take is declared once, here, by one
# function. Its help is the same on every command, except through the
# function's named parameters (what --seed seeds, the --dim defaults):
# tests/test_cli_options.py holds both to that.

def _model_args(p: argparse.ArgumentParser) -> None:
    """MODEL and --set."""
    from .frontends.catalog import DEFAULT_MODEL
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL, metavar="MODEL",
                   help=f"a built-in model (see `blockc models`) or path/to/file.py:name (default: {DEFAULT_MODEL})")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a model setting, e.g. --set layers=2 --set d_model=64 (repeatable)")


def _form_arg(p: argparse.ArgumentParser, *, default: str = "standard", start: bool = False) -> None:
    """--form: the graph form a command works on (``default`` when not given).

    ``start``: the command optimizes the graph itself (check, fusions), so
    --form is the form the fusions start from and ``fused`` is not offered.
    The default is applied by ``_resolve_forms``, which must know whether
    --form was given.
    """
    from .passes.forms import FORMS
    choices = tuple(f for f in FORMS if f != "fused") if start else FORMS
    meanings = {"standard": "norms, softmax and GELU as single ops", "decomposed": "primitive math",
                "fused": "through the optimization pipeline"}
    listed = ", ".join(f"{f} ({meanings[f]})" for f in choices)
    p.add_argument("--form", choices=choices, default=None,
                   help=f"the graph form{' the fusions start from' if start else ''}: {listed} (default {default})")
    p.set_defaults(form_default=default)


def _fused_as_arg(p: argparse.ArgumentParser, *, all_forms: bool = False, picks_form: bool = True) -> None:
    """--fused-as: how fused ops are written in ONNX.

    ``all_forms`` adds ``all`` (check: every encoding in turn). ``picks_form``:
    the command's --form decides whether there are fused ops at all (export,
    run), so --fused-as alone means --form fused and an unfused --form with
    it is refused (``_resolve_forms``). Without it (check, fusions, compare)
    the command makes fused ops whatever --form says.
    """
    from .codegen.fused_encodings import ENCODINGS
    choices = ENCODINGS + (("all",) if all_forms else ())
    default = "all" if all_forms else "auto"
    p.add_argument("--fused-as", choices=choices, default=None,
                   help="how fused ops are written in ONNX: function (an ONNX local function, portable), contrib "
                        "(ONNX Runtime's com.microsoft ops), onnx23 (opset-23 Attention/RMSNormalization), auto "
                        "(the encoding measured fastest for the provider)" + ("; all: every encoding" if all_forms else "")
                        + f" (default {default})"
                        + ("; given without --form it means --form fused, and --form standard or decomposed "
                           "with it is an error" if picks_form else ""))
    p.set_defaults(fused_as_default=default, fused_as_picks_form=picks_form)


def _provider_arg(p: argparse.ArgumentParser) -> None:
    """--provider; None until ``_resolve_forms``, so that a backend gets it only where it was given."""
    p.add_argument("--provider", choices=("cpu", "cuda", "auto"), default=None,
                   help="ONNX Runtime execution provider (default cpu)")
    p.set_defaults(provider_default="cpu")


def _weights_args(p: argparse.ArgumentParser, *, seeds: str = "the weights and inputs") -> None:
    """--seed and --weights; ``seeds`` says what the seed makes on this command."""
    p.add_argument("--seed", type=int, default=0, help=f"seed of {seeds} (default 0)")
    p.add_argument("--weights", metavar="FILE",
                   help="a .safetensors or .npz file of weights to use instead of seeded ones")


def _dim_arg(p: argparse.ArgumentParser, *, defaults: dict[str, int] | None, purpose: str = "") -> None:
    """--dim NAME=INT. ``defaults``: the sizes ``_bindings`` starts from on this
    command (stated once, here, for the help and the code); ``purpose``: what
    the sizes are for, where that is not running the model."""
    if defaults:
        p.set_defaults(dim_defaults=defaults)
    said = ", ".join(f"{k}={v}" for k, v in defaults.items()) if defaults else "none"
    p.add_argument("--dim", action="append", metavar="NAME=INT",
                   help=f"bind a symbolic dimension{purpose} (repeatable; default {said})")


def _gemm_arg(p: argparse.ArgumentParser) -> None:
    """--gemm and --tf32, said the same way on every command."""
    p.add_argument("--gemm", choices=("cublas", "tiled"),
                   help="the CUDA MatMul: cublas (cuBLASLt, tensor cores; what a GPU runs by default) or tiled "
                        "(a portable SIMT kernel, what emulation runs); default: cublas for a GPU (blockc cuda, --backend "
                        "cuda), tiled on cuda-emu")
    p.add_argument("--tf32", action="store_true",
                   help="with cublas, float32 GEMMs on TF32 tensor cores (about 10 mantissa bits; blockc check "
                        "--backend cuda --tf32 shows the error); float16/bfloat16 are unchanged")


# The flags that are backend options (``runtime/backend.py``), by option name.
BACKEND_FLAGS = ("provider", "fused_as", "gemm", "tf32", "float64")


def _backend_options(args) -> dict:
    """The backend options the command line gave, read before ``_resolve_forms``
    fills in defaults: each goes to the backend only when given, and a
    backend refuses one it does not take (``make_backend``), rather than
    ignoring it."""
    return {k: getattr(args, k) for k in BACKEND_FLAGS if getattr(args, k, None) not in (None, False)}


def _dtype_arg(p: argparse.ArgumentParser, *, choices: tuple[str, ...]) -> None:
    """--dtype; ``choices``: the dtypes the command's targets support."""
    p.add_argument("--dtype", choices=choices, help="the model's dtype, as --set dtype= (default: the model's own)")


def _json_arg(p: argparse.ArgumentParser, *, what: str, schema: str | None = None) -> None:
    p.add_argument("--json", metavar="FILE",
                   help=f"also write {what} as JSON to FILE" + (f" (schema: {schema})" if schema else ""))


def _resolve_forms(args) -> None:
    """Give --form, --fused-as and --provider their values, knowing which were given.

    Where --form decides whether there are fused ops (export, run),
    ``--fused-as X`` alone means ``--form fused``, and an explicit unfused
    --form with it is refused: that graph has no fused op to write as X.
    """
    form, fused_as = getattr(args, "form", None), getattr(args, "fused_as", None)
    if fused_as is not None and getattr(args, "fused_as_picks_form", False) and hasattr(args, "form"):
        if form is None:
            args.form = "fused"
        elif form != "fused":
            raise BlockcError(f"--fused-as {fused_as} says how fused ops are written, but --form {form} has no "
                              f"fused ops: use --form fused, or leave --form out (--fused-as alone means it)")
    if hasattr(args, "form") and args.form is None:
        args.form = args.form_default
    if hasattr(args, "fused_as") and args.fused_as is None:
        args.fused_as = args.fused_as_default
    if hasattr(args, "provider") and args.provider is None:
        args.provider = args.provider_default


def _optimize_args(p: argparse.ArgumentParser) -> None:
    from .passes.manager import pass_names
    g = p.add_argument_group("optimization", f"passes: {', '.join(pass_names())}")
    g.add_argument("--disable", action="append", default=[], metavar="PASS",
                   help="skip a pass, e.g. --disable fuse_attention (repeatable)")
    g.add_argument("--print-after", action="append", default=[], metavar="PASS",
                   help="print the IR after PASS (repeatable)")
    g.add_argument("--print-after-all", action="store_true", help="print the IR after every pass")


def _optimize_options(args) -> dict:
    return {"disable": getattr(args, "disable", []), "print_after": getattr(args, "print_after", []),
            "print_after_all": getattr(args, "print_after_all", False), "out": sys.stderr}


def _built(args):
    """The model the arguments name, not traced."""
    from .frontends import build_model
    from .frontends.catalog import parse_sets
    return build_model(args.model, parse_sets(args.set))


def _model(args, progress=None):
    """The model and its trace (refused first if its graph cannot fit: ``trace``)."""
    from .frontends import trace
    model = _built(args)
    return model, trace(model, progress=progress)


def _graph(args, progress=None):
    from .passes.forms import to_form
    from .ir.verify import verify

    model, traced = _model(args, progress)
    form = getattr(args, "form", "standard")
    if form != "fused" and (getattr(args, "disable", None) or getattr(args, "print_after", None)
                            or getattr(args, "print_after_all", False)):
        raise BlockcError("--disable/--print-after apply to --form fused")
    graph = to_form(traced, form, progress=progress, **(_optimize_options(args) if form == "fused" else {}))
    verify(graph)
    return model, graph


# A job that ends sooner than this shows no progress bar: a quick export
# prints what it always did, with no bar flashing by.
PROGRESS_DELAY_S = 1.0
# Where no bar can be drawn (a pipe, a log), compare's progress is a line at
# most this often: a few lines a minute, never minutes of silence.
PROGRESS_LINE_S = 15.0


class _ProgressBar:
    """A ``blockc.progress`` callback that draws a rich progress bar, one line
    a stage, on ``stream`` (stderr), and only where that is a terminal and the
    job has run ``delay`` seconds: pipes, files and tests see nothing, unless
    ``lines_every`` is given (a job of minutes, such as compare): then they
    get a plain line, where the job stands, at most that many seconds apart,
    so a log is never minutes of silence. Stages reported before the bar
    appears are shown as they stand. A context manager: the bar is removed
    when the job ends, however it ends."""

    def __init__(self, stream=None, delay: float = PROGRESS_DELAY_S, show: bool = True,
                 lines_every: float | None = None):
        self.stream = stream if stream is not None else sys.stderr
        terminal = self.stream.isatty()
        self.show = show and terminal
        self.lines_every = lines_every if show and not terminal else None
        self.delay, self.started = delay, time.perf_counter()
        self.last_line = None
        self.stages: dict[str, tuple[int, int, str]] = {}
        self.bar, self.tasks = None, {}

    def _line(self, stage: str, done: int, total: int, detail: str) -> None:
        now = time.perf_counter()
        if self.last_line is not None and now - self.last_line < self.lines_every and done < total:
            return
        self.last_line, spent = now, now - self.started
        left = f", about {spent / done * (total - done):.0f} s left" if 0 < done < total else ""   # as the bar's
        self.stream.write(f"{stage} {done}/{total}{': ' + detail if detail else ''} ({spent:.0f} s so far{left})\n")
        self.stream.flush()

    def __call__(self, stage: str, done: int, total: int, detail: str = "") -> None:
        if self.lines_every is not None:
            self._line(stage, done, total, detail)
        if not self.show:
            return
        self.stages[stage] = (done, total, detail)
        if self.bar is None:
            if time.perf_counter() - self.started < self.delay:
                return
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
            # time remaining, not elapsed: a stage begun before the bar appeared would show too little
            self.bar = Progress(TextColumn("{task.description:<24}"), BarColumn(), MofNCompleteColumn(),
                                TimeRemainingColumn(), TextColumn("{task.fields[detail]}"), transient=True,
                                console=Console(file=self.stream, force_terminal=True))
            self.bar.start()
        for name, (done, total, detail) in self.stages.items():  # a handful: every stage the job has begun
            if name not in self.tasks:
                self.tasks[name] = self.bar.add_task(name, total=total, detail=detail)
            self.bar.update(self.tasks[name], completed=done, total=total, detail=detail)

    def __enter__(self) -> "_ProgressBar":
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()


def _weights(args, model):
    from .frontends import init_weights
    if getattr(args, "weights", None):
        from .frontends.weights import check_weights, load_weights
        weights = load_weights(args.weights)
        check_weights(model, weights)
        return weights
    from .frontends.module import check_weights_fit
    check_weights_fit(model)  # before numpy tries to allocate them
    return init_weights(model, seed=args.seed)


def _parse_dims(items: list[str] | None) -> dict[str, int]:
    """``["seq=128"]`` -> ``{"seq": 128}``; sizes are checked by their users."""
    dims = {}
    for item in items or []:
        key, eq, value = item.partition("=")
        if not eq or not value.strip().lstrip("-").isdigit():
            raise BlockcError(f"malformed --dim {item!r}: expected NAME=INT, e.g. --dim seq=128")
        dims[key.strip()] = int(value)
    return dims


def _asked_dims(args, graph) -> dict[str, int]:
    """The sizes --dim asks for, each checked to name a dimension of the model."""
    dims = _parse_dims(args.dim)
    symbols = graph.symbols()
    unknown = [k for k in dims if k not in symbols and k not in ("batch", "seq")]
    if unknown:
        raise BlockcError(f"--dim {', '.join(unknown)}: the model has no such dimension "
                          f"(its dimensions: {', '.join(symbols)})")
    for k, v in dims.items():
        if v <= 0:
            raise BlockcError(f"--dim {k}={v}: dimensions must be positive")
    return dims


def _bindings(args, graph) -> dict[str, int]:
    """The command's default sizes (declared with its --dim), overridden by
    --dim, held to the limits the graph's tables set (``ops/limits.py``)."""
    from .ops.limits import graph_limits
    bindings = dict(args.dim_defaults)
    # An imported ONNX file keeps its own dim names (batch_size, sequence_length):
    # those take the command's batch or seq default, whichever their name says.
    for name in graph.symbols():
        if name not in bindings:
            fallback = bindings.get("batch" if name.lower().startswith(("batch", "n")) else "seq")
            if fallback is not None:
                bindings[name] = fallback
    asked = _asked_dims(args, graph)
    bindings.update(asked)
    limits = graph_limits(graph)
    bindings, notes = limits.fit_defaults(bindings, defaulted=bindings.keys() - asked.keys())
    for note in notes:
        print(f"blockc: {note}", file=sys.stderr)
    for limit, n in limits.dims_over(bindings):
        raise BlockcError(f"--dim {limit.dim}={n} exceeds the model's maximum of {limit.limit}")
    too_big = limits.size_over(bindings)   # before any input is sampled or memory planned
    if too_big:
        raise BlockcError(too_big)
    symbols = graph.symbols()
    return {k: v for k, v in bindings.items() if k in symbols}


def _feeds(args, model, graph) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """``(feeds, bindings)``: the arrays of --inputs, checked against the
    graph's inputs (their shapes bind the dims), or inputs sampled as each
    ``InputSpec`` says from --seed at the --dim sizes."""
    from .files import check_writable
    from .runtime.feeds import check_feeds, load_npz
    if getattr(args, "save", None):
        check_writable(args.save)  # now, not after the run
    if not getattr(args, "inputs", None):
        bindings = _bindings(args, graph)
        rng = np.random.default_rng(args.seed)
        return {s.name: s.sample(bindings, rng) for s in model.inputs()}, bindings
    return check_feeds(graph, load_npz(args.inputs), dims=_asked_dims(args, graph),
                       source=f"the arrays of {args.inputs}")


# ---- commands ----------------------------------------------------------------
def cmd_models(args) -> int:
    import dataclasses
    from .frontends.catalog import BUILTINS, DEFAULT_MODEL
    for b in BUILTINS.values():
        mark = " (default)" if b.name == DEFAULT_MODEL else ""
        print(f"{b.name}{mark}\n    {b.about}")
        fields = {f.name: f.default for f in dataclasses.fields(b.config)}
        fields.update(b.defaults)
        print("    settings: " + ", ".join(f"{k}={v}" for k, v in fields.items()))
    print("\nor your own: path/to/file.py:name (a blockc.Model, a Model subclass, or a function returning one)")
    return 0


def cmd_show(args) -> int:
    _, graph = _graph(args)
    sys.stdout.write(str(graph))
    return 0


def cmd_summary(args) -> int:
    from .frontends.summary import summarize
    # Counted from the module tree: a 100,000-layer model is counted, not traced.
    print(summarize(_built(args)).format())
    return 0


def cmd_export(args) -> int:
    from .codegen.onnx_export import save_onnx
    if args.no_weights and args.weights:
        raise BlockcError("--no-weights and --weights contradict each other")
    # --print-after writes the IR to the terminal as the passes run: no bar under it
    with _ProgressBar(show=not (args.print_after or args.print_after_all)) as progress:
        model, graph = _graph(args, progress)
        weights = None if args.no_weights else _weights(args, model)
        t0 = time.perf_counter()
        decisions: list = []
        save_onnx(graph, weights, args.output, opset=args.opset, fused_as=args.fused_as, provider=args.provider,
                  decisions=decisions, progress=progress)
    forms = sorted({f"{d['op']}: {d['form']}" for d in decisions})
    print(f"wrote {args.output}: {len(graph.nodes)} IR nodes, {len(graph.params)} parameters, "
          f"{time.perf_counter() - t0:.2f} s" + (f"; fused ops as {', '.join(forms)}" if forms else ""))
    if args.no_weights:
        print(f"weights not written: they are declared in {os.path.basename(args.output)}.data, to be filled "
              "in by blockc.codegen.onnx_weights_file.save_onnx_weights")
    return 0


def cmd_run(args) -> int:
    from .errors import printable
    from .frontends.module import InputSpec  # noqa: F401  (documented input sampling)
    from .report.numerics import max_abs_error
    from .runtime.backend import make_backend
    from .runtime.reference import run_reference
    backend = make_backend(args.backend, **args.backend_options)   # an option it does not take: refused first
    model, graph = _graph(args)
    weights = _weights(args, model)
    feeds, bindings = _feeds(args, model, graph)
    backend.require()
    seconds, weights, outputs = _build_and_run(backend, graph, weights, feeds)
    dims = ", ".join(f"{k}={v}" for k, v in bindings.items())
    source = f"inputs {args.inputs}" if args.inputs else f"seed {args.seed}"
    if args.weights:   # read from the file before any of this: nothing was made
        del seconds["weights made"]
    print(f"{printable(graph.name)} [{args.form}] on {backend.title}, {dims}, {source}: "
          + ", ".join(f"{what} {s * 1e3:.1f} ms" for what, s in seconds.items()))
    oracle = run_reference(graph, weights, feeds, float64=True) if args.check else None
    header = f"  {'output':<20} {'shape':<18} {'dtype':<9} {'mean':>11} {'std':>11} {'min':>11} {'max':>11}"
    print(header + ("  max |err| vs f64" if oracle else ""))
    for name, a in outputs.items():
        f = a.astype(np.float64)
        line = (f"  {printable(name):<20} {str(list(a.shape)):<18} {str(a.dtype):<9} {f.mean():>11.4g} {f.std():>11.4g} "
                f"{f.min():>11.4g} {f.max():>11.4g}")
        if oracle:
            err = max_abs_error(a, oracle[name])
            line += f"  {err:.3g}"
        print(line)
    if args.save:
        from .runtime.feeds import save_npz
        save_npz(args.save, outputs)
        print(f"wrote {args.save}")
    if oracle:
        return _check_finite(graph, weights, feeds, outputs, oracle, backend.title)
    return 0


def _build_and_run(backend, graph, weights, feeds) -> tuple[dict[str, float], dict, dict]:
    """``(seconds, weights, outputs)``: making the weights (seeded ones are
    made on access: all now, once, not inside the build or the run),
    compiling ``graph`` with them, then one run of ``feeds``, each timed
    apart; the feeds are checked before any of it (a bad feed should not
    cost a build)."""
    from .frontends.weights import materialize
    from .runtime.bindings import bind_inputs
    bindings = bind_inputs(graph, feeds)
    t0 = time.perf_counter()
    weights = materialize(weights)
    t1 = time.perf_counter()
    with backend.compile(graph, weights) as compiled:
        run = compiled.unchecked_runner(feeds, bindings)
        t2 = time.perf_counter()
        outputs = run()
        t3 = time.perf_counter()
    return {"weights made": t1 - t0, "build": t2 - t1, "first run": t3 - t2}, weights, outputs


def cmd_generate(args) -> int:
    import json
    from .generate.loop import cache_length, check_request, generate
    from .generate.sampling import Sampler
    from .generate.stream import TokenLines, format_timings
    from .runtime.backend import make_backend
    prompts = [list(_int_list("--prompt-ids", text)) for text in args.prompt_ids]
    sampling = args.temperature is not None and args.temperature != 0
    if not sampling and (args.top_k or args.top_p != 1.0):
        raise BlockcError("--top-k and --top-p filter what is sampled: give --temperature T (> 0) with them")
    # temperature 0 (or none): greedy, after any repetition penalty, as Hugging Face's do_sample=False
    pick = Sampler(args.temperature or 0.0, args.top_k, args.top_p, args.repetition_penalty, seed=args.seed)
    model = _built(args)
    check_request(model, prompts, args.max_new)   # before any weights are made
    cache_length(model, prompts, args.max_new, args.cache, args.cache_len)
    make_backend(args.backend).require()
    lines = TokenLines(len(prompts))
    result = generate(model, _weights(args, model), prompts, args.max_new, backend=args.backend, pick=pick,
                      stop_id=args.stop_id, on_token=lines, form=args.form, cache=args.cache,
                      cache_len=args.cache_len)
    lines.finish(result.tokens)
    print(format_timings(result))
    if args.json:
        _write_text(args.json, json.dumps({"model": args.model, "prompts": prompts, **result.as_json()},
                                          indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def _check_finite(graph, weights, feeds, outputs, oracle, where: str) -> int:
    """``run --check``: 1, with where the values first stopped being finite, when any output is NaN/Inf."""
    from .report.numerics import first_non_finite, non_finite_outputs
    bad = non_finite_outputs(outputs)
    if not bad:
        return 0
    if non_finite_outputs(oracle):
        origin = first_non_finite(graph, weights, feeds)
    else:
        origin = (f"the float64 reference is finite, so {where} made them; "
                  + first_non_finite(graph, weights, feeds, float64=False))
    print(f"blockc: check failed: the outputs are not finite ({'; '.join(bad)}); {origin}", file=sys.stderr)
    return 1


def cmd_fusions(args) -> int:
    import json
    from .passes.forms import to_form
    from .frontends.catalog import parse_sets
    from .passes.manager import optimize
    from .report.fusions import build_report, format_report
    model, traced = _model(args)
    graph = to_form(traced, args.form)
    result = optimize(graph, **_optimize_options(args))
    bindings = _bindings(args, graph)
    decisions: list = []
    if not args.no_onnx_forms:  # which ONNX form each fused op gets, and why
        from .codegen.onnx_export import export_onnx
        export_onnx(result.graph, _weights(args, model), fused_as=args.fused_as, provider=args.provider,
                    decisions=decisions)
    report = build_report(args.model, graph, result, bindings, parse_sets(args.set), args.form,
                          onnx_encodings=decisions)
    print(format_report(report, verbose=args.verbose))
    if args.json:
        _write_text(args.json, json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0


def cmd_check(args) -> int:
    from .codegen.fused_encodings import ENCODINGS
    from .passes.forms import to_form
    from .report.numerics import check_fusions, format_check, fusion_variants
    from .runtime.backend import backend_options, make_backend, split_options
    given = split_options(args.backend, args.backend_options)   # an option none of them takes: refused first
    model, traced = _model(args)
    graph = to_form(traced, args.form)
    weights = dict(_weights(args, model))
    feeds = _feeds(args, model, graph)[0]
    ok, checked, variants = True, set(), None
    for name in args.backend:
        options = {k: v for k, v in given[name].items() if k != "fused_as"}
        # --fused-as all: each ONNX encoding in turn, on the backends that take one
        encodings = (ENCODINGS if args.fused_as == "all" else (args.fused_as,)) \
            if "fused_as" in backend_options(name) else (None,)
        for encoding in encodings:
            backend = make_backend(name, **options, **({"fused_as": encoding} if encoding else {}))
            if backend.label in checked:
                continue
            checked.add(backend.label)
            backend.require()
            variants = variants or fusion_variants(graph)   # the same graphs on every backend: made once
            result = check_fusions(graph, weights, feeds, backend=backend.label, variants=variants,
                                   run=lambda g, backend=backend: backend.run(g, weights, feeds))
            print(format_check(result))
            ok &= result.passed
    return 0 if ok else 1


def cmd_cuda(args) -> int:
    import json
    from .version import __version__
    from .codegen.cuda import build as cuda_build, toolchain
    from .codegen.cuda.lower import generate
    from .files import output_folder
    from .report.cuda_summary import compile_report, format_cuda_summary
    archs = [a.strip() for a in args.arch.split(",") if a.strip()]
    if not args.no_compile and toolchain.find_nvcc().path:
        # one CUDA's nvcc and headers, and archs it builds for: refused before any work
        toolchain.check_archs(toolchain.find_toolkit().nvcc, archs)
    if args.dtype:
        args.set = list(args.set) + [f"dtype={args.dtype}"]
    model, graph = _graph(args)
    weights = _weights(args, model)
    bindings = _bindings(args, graph)
    cuda = generate(graph, weights, form=args.form, version=__version__, gemm=cuda_build.gpu_gemm(args.gemm),
                    tf32=args.tf32)
    # the build appears whole or not at all: a failed compile or Ctrl-C leaves no folder
    with output_folder(args.output, last="summary.json") as out:
        meta = cuda_build.write_build(cuda, str(out), archs=archs, bindings=bindings)
        summary = compile_report(cuda, meta, str(out / "model.cu"), archs, compile=not args.no_compile)
        if summary.get("compiled") is False:
            # nvcc named the files in the hidden folder, which goes with this error
            raise toolchain.ToolchainError(summary["error"].replace(str(out), args.output))
        _write_text(str(out / "summary.json"), json.dumps(summary, indent=2) + "\n")
    if args.json:
        _write_text(args.json, json.dumps(summary, indent=2) + "\n")
    print(format_cuda_summary(summary))
    print(f"\nwrote {args.output}: model.cu, blockc_cuda.h, blockc_model.h, weights.bin, model.json, summary.json, build.sh")
    return 0


def _int_list(flag: str, text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise BlockcError(f"malformed {flag} {text!r}: expected integers separated by commas, e.g. {flag} 1,8") from None
    if not values:
        raise BlockcError(f"{flag} needs at least one integer")
    return values


def _name_list(text: str) -> tuple[str, ...]:
    return () if text.strip().lower() == "none" else tuple(x.strip() for x in text.split(",") if x.strip())


def compare_options(args):
    """``blockc compare``'s flags as ``compare.CompareOptions``."""
    import shlex

    from .compare import CompareOptions
    from .files import parse_size
    return CompareOptions(
        model=args.model, settings=args.set, dtype=args.dtype, backends=_name_list(args.backends),
        peers=_name_list(args.peers), batches=_int_list("--batch", args.batch),
        seqs=None if args.seq is None else _int_list("--seq", args.seq),
        dims=_parse_dims(args.dim), threads=args.threads, warmup=args.warmup, min_repeats=args.repeats,
        min_time_s=args.min_time, rounds=args.rounds, blocks=args.blocks,
        max_memory=None if args.max_memory is None else parse_size(args.max_memory, "--max-memory"),
        fused_as=args.backend_options.get("fused_as"), peak_gbps=args.peak_gbps, seed=args.seed,
        weights=args.weights, kernels=not args.no_kernels, command="blockc " + shlex.join(args.argv))


def cmd_compare(args) -> int:
    import json

    from .compare import plan_comparison, run_comparison
    from .compare.run import describe_plan
    from .compare.table import make_console, print_report
    options = compare_options(args)
    # Everything a user can get wrong fails here, before any measuring (the output paths in _check_outputs).
    plan = plan_comparison(options)
    console = make_console()
    for line in describe_plan(plan):
        console.print(line)
    with _ProgressBar(delay=0, show=not args.no_progress, lines_every=PROGRESS_LINE_S) as bar:
        report = run_comparison(plan, bar)
    print_report(report, console)
    if args.report:   # first: the folder appears with it, and --json may name a file inside it
        from .compare.pictures import block_graphs
        from .report.compare_html import write_html_report
        before, after = block_graphs(options)
        page = write_html_report(report, args.report, before=before, after=after)
        print(f"wrote {page}")
    if args.json:
        _write_text(args.json, json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    # a row the memory budget kept from running is "skipped", said in the table; only an error fails
    return 0 if all(r["status"] != "error" for r in report["results"] if not r["peer"]) else 1


def cmd_cache(args) -> int:
    from .files import cache_entries, cache_limit, cache_root, format_bytes, prune_cache
    root = cache_root()
    if args.clear:
        removed = prune_cache(0)
        print(f"removed {len(removed)} entries ({format_bytes(sum(e.size for e in removed))}) from {root}")
        return 0
    entries = cache_entries()
    for e in reversed(entries):   # the most recently used first
        print(f"{format_bytes(e.size):>10}  {time.strftime('%Y-%m-%d %H:%M', time.localtime(e.used))}  "
              f"{e.path.relative_to(root)}")
    print(f"{root}: {len(entries)} entries, {format_bytes(sum(e.size for e in entries))} "
          f"(at most {format_bytes(cache_limit())}: BLOCKC_CACHE_MAX)")
    return 0


def _check_outputs(args) -> None:
    """Every path a command will write, checked before it does any work, so
    a bad -o costs nothing and never ends in a traceback halfway through."""
    from .files import check_writable, check_writable_dir
    if args.command == "export":
        check_writable(args.output)
    elif args.command == "cuda":
        check_writable_dir(args.output, "the build into", "-o")
    elif args.command == "compare" and args.report:
        from .report.compare_html import check_report_dir
        check_report_dir(args.report)
    if getattr(args, "json", None) and not _inside(args.json, getattr(args, "report", None)):
        check_writable(args.json)   # (one inside --report's folder is written after the report makes it)


def _inside(path: str, folder: str | None) -> bool:
    """Whether ``path`` lies in ``folder`` (or below it)."""
    if not folder:
        return False
    folder = os.path.abspath(folder)
    return os.path.commonpath([os.path.abspath(path), folder]) == folder


def _write_text(path: str, text: str) -> None:
    """Write atomically: a failed write leaves no partial file."""
    from .files import atomic_write
    with atomic_write(path, "w") as f:
        f.write(text)


def _arch_list(text: str) -> str:
    """--arch, checked where it is parsed: comma-separated ``sm_XX`` (a
    ``BlockcError``, which argparse lets through, so it is blockc's one-line
    error rather than argparse's usage message)."""
    import re
    archs = [a.strip() for a in text.split(",") if a.strip()]
    bad = [a for a in archs if not re.fullmatch(r"sm_\d{2,3}[a-z]?", a)]
    if bad or not archs:
        from .errors import printable
        raise BlockcError(f"--arch {printable(text)!s}: " + (f"{', '.join(repr(a) for a in bad)} is not a GPU "
                          "architecture" if bad else "no architecture given")
                          + "; give comma-separated sm_XX, e.g. --arch sm_80,sm_90")
    return ",".join(archs)


class _Parser(argparse.ArgumentParser):
    """argparse with blockc's errors: a mistake in the arguments is a
    ``BlockcError``, which ``main`` prints as its one line, ``blockc: error:
    ...``, exit status 2 (argparse prints its usage block and, for a command,
    ``blockc generate: error:``). The command's own parser raises it too:
    ``add_subparsers`` makes them of the parser's class."""

    def error(self, message: str):
        raise BlockcError(f"{message} (see {self.prog} --help)")

    def parse_args(self, args=None, namespace=None):
        """The arguments, with ``backend_options``: the backend flags as given,
        read before ``_resolve_forms`` fills in their defaults."""
        parsed = super().parse_args(args, namespace)
        parsed.backend_options = _backend_options(parsed)
        return parsed


def build_parser() -> argparse.ArgumentParser:
    from .runtime.backend import backend_names, compare_backends
    parser = _Parser(
        prog="blockc", description="blockc: a compiler for transformer models. Declare or pick a model, "
        "see its IR, export ONNX, run it.", epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("models", help="list the built-in models and their settings",
                       description="List the built-in models, their settings and defaults.")
    p.set_defaults(fn=cmd_models)

    p = sub.add_parser("show", help="print a model's IR", description="Trace MODEL and print its IR "
                       "(one line per node; the text parses back with blockc.parse_graph).")
    _model_args(p)
    _form_arg(p)
    _optimize_args(p)
    p.set_defaults(fn=cmd_show)

    p = sub.add_parser("fusions", help="what fused, what did not and why",
                       description="Optimize MODEL and report every fusion candidate: matched, or rejected "
                       "with the reason; which original nodes went into which fused op; node counts and "
                       "modelled memory traffic before and after.")
    _model_args(p)
    _form_arg(p, start=True)
    _optimize_args(p)
    _dim_arg(p, defaults={"batch": 1, "seq": 128}, purpose=" for the traffic model")
    _json_arg(p, what="the report", schema="docs/fusion-report.md")
    p.add_argument("--verbose", action="store_true", help="list every rejected candidate")
    _fused_as_arg(p, picks_form=False)
    _provider_arg(p)
    p.add_argument("--no-onnx-forms", action="store_true",
                   help="skip working out each fused op's ONNX form (it exports the model with seeded weights)")
    _weights_args(p, seeds="the weights exported to work out the ONNX forms")
    p.set_defaults(fn=cmd_fusions)

    p = sub.add_parser("check", help="numeric A/B of every fusion",
                       description="Run the unfused graph and the fused graph (each fusion alone, then all "
                       "together) in float32 against the float64 reference; a fusion passes when its error is "
                       "at most 2x the unfused error plus 1e-6. Exit status 1 on failure.")
    _model_args(p)
    _form_arg(p, start=True)
    p.add_argument("--backend", action="append", choices=backend_names(),
                   help="backends to check on (repeatable; default: reference and ort)")
    _fused_as_arg(p, all_forms=True, picks_form=False)
    _provider_arg(p)
    _gemm_arg(p)
    _dim_arg(p, defaults={"batch": 2, "seq": 16})
    _weights_args(p)
    p.set_defaults(fn=cmd_check)

    p = sub.add_parser("summary", help="parameter counts per module",
                       description="Print MODEL's parameters per module, the total, and the non-embedding "
                       "count against the 12·L·d² rule of thumb.")
    _model_args(p)
    p.set_defaults(fn=cmd_summary)

    p = sub.add_parser("export", help="write the model as ONNX", description="Export MODEL as an ONNX file "
                       "(standard ops, dynamic batch/seq, weights as initializers; external data past 2 GB).")
    _model_args(p)
    _form_arg(p)
    _optimize_args(p)
    p.add_argument("-o", "--output", required=True, help="the .onnx file to write")
    p.add_argument("--opset", type=int, help="ONNX opset (default: 21, or 23 for --fused-as onnx23)")
    _fused_as_arg(p)
    _provider_arg(p)
    _weights_args(p, seeds="the weights")
    p.add_argument("--no-weights", action="store_true",
                   help="write the model only, its weights declared as external data in <output>.data "
                   "(laid out, not written): any size exports in seconds")
    p.set_defaults(fn=cmd_export)

    p = sub.add_parser("cuda", help="generate CUDA C++ and prove it compiles",
                       description="Generate CUDA C++ for MODEL into DIR (kernels from templates, a host file with "
                       "a static memory plan and a C API, a weights file, build.sh), compile it with nvcc for each "
                       "--arch and report every kernel's registers, spills and shared memory.")
    _model_args(p)
    _form_arg(p, default="fused")
    _optimize_args(p)
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="the build directory to write")
    p.add_argument("--arch", default="sm_80,sm_90", type=_arch_list,
                   help="GPU architectures, comma-separated sm_XX (default sm_80,sm_90)")
    _dtype_arg(p, choices=("float32", "float16", "bfloat16"))
    _gemm_arg(p)
    _dim_arg(p, defaults={"batch": 1, "seq": 128}, purpose=" for the memory-plan figures")
    _weights_args(p, seeds="the weights")
    _json_arg(p, what="the summary")
    p.add_argument("--no-compile", action="store_true", help="write the build without running nvcc")
    p.set_defaults(fn=cmd_cuda)

    p = sub.add_parser("run", help="run the model on your inputs or seeded random ones",
                       description="Run MODEL on the arrays of --inputs FILE.npz, or on seeded random inputs, "
                       "print a summary of each output, and with --save write the outputs.")
    _model_args(p)
    _form_arg(p)
    _optimize_args(p)
    p.add_argument("--backend", choices=backend_names(), default="ort",
                   help="reference: the numpy interpreter; ort: ONNX Runtime (default; ort-cpu, ort-cuda: with that "
                        "provider); cuda: generated CUDA on a GPU; cuda-emu: the same CUDA source emulated on the "
                        "CPU; torch-eager, torch-compile: the graph as a PyTorch module")
    _gemm_arg(p)
    _fused_as_arg(p)
    _provider_arg(p)
    p.add_argument("--inputs", metavar="FILE.npz",
                   help="run on these arrays, named after the model's inputs (numpy.savez); their shapes bind "
                        "the dims, and every mismatch with the model's inputs is listed")
    p.add_argument("--save", metavar="FILE.npz", help="write the outputs, by name, to this .npz file")
    _dim_arg(p, defaults={"batch": 2, "seq": 16})
    _weights_args(p, seeds="the weights, and of the inputs where --inputs gives none")
    p.add_argument("--float64", action="store_true", help="reference backend: compute in float64 (refused on others)")
    p.add_argument("--check", action="store_true", help="also report each output's max error against the "
                   "float64 reference")
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("generate", help="generate tokens with a KV cache",
                       description="Generate up to --max-new tokens after each --prompt-ids with a decoder model "
                       "(gpt2, tiny, llama-tiny, qwen3-tiny or your own DecoderLM): the prompts are batched "
                       "left-padded, a prefill graph runs once and a decode graph per token, feeding back the "
                       "key/value cache. Prints each prompt's new ids (redrawn as they come on a terminal), then "
                       "the time to the first token, each decode step's median and p90, and tokens per second.")
    _model_args(p)
    _form_arg(p, default="fused")
    p.add_argument("--prompt-ids", action="append", required=True, metavar="IDS",
                   help="one prompt's token ids, comma-separated, e.g. 1,2,3 (repeatable: one prompt each)")
    p.add_argument("--max-new", type=int, default=32, help="new tokens per prompt, at most (default 32)")
    pick = p.add_mutually_exclusive_group()
    pick.add_argument("--greedy", action="store_true", help="pick the most likely token (the default)")
    pick.add_argument("--temperature", type=float, metavar="T",
                      help="sample instead: divide the logits by T (> 0; 0 is greedy), as Hugging Face's do_sample")
    p.add_argument("--top-k", type=int, default=0, metavar="K", help="sampling: keep the K most likely (default 0: all)")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P",
                   help="sampling: keep the fewest most likely tokens whose probability reaches P, in (0, 1] "
                        "(default 1: all)")
    p.add_argument("--repetition-penalty", type=float, default=1.0, metavar="R",
                   help="scores of ids already in a row divided (positive) or multiplied (negative) by R "
                        "(default 1: none); applies to greedy picks too")
    p.add_argument("--stop-id", type=int, metavar="ID", help="a prompt stops after this token id")
    p.add_argument("--cache", choices=("inplace", "concat"), default="inplace",
                   help="inplace (default): each layer's cache preallocated and written in place by the decode "
                   "step, kept by the backend between steps; concat: a new, one-row-longer cache every step")
    p.add_argument("--cache-len", type=int, metavar="N", help="positions the in-place cache holds (default: the "
                   "longest prompt and --max-new; fewer is refused)")
    p.add_argument("--backend", choices=backend_names(), default="ort-cpu",
                   help="where the graphs run (default ort-cpu): reference, ort-cpu, cuda-emu, ...")
    _weights_args(p, seeds="the weights (where made, not read from --weights) and of sampling")
    _json_arg(p, what="the ids and timings")
    p.set_defaults(fn=cmd_generate)

    p = sub.add_parser("compare", help="fused against unfused, measured side by side with the peers",
                       description="Measure MODEL in every form (decomposed, standard, fused) on every available "
                       "backend, and the peers (ONNX Runtime's transformer optimizer, on the file itself where MODEL is an "
                       "ONNX file; that file unmodified on ONNX Runtime; PyTorch eager; torch.compile) "
                       "on the same weights, shapes, threads and repeats: latency, speedup against the standard "
                       "form, node and kernel counts, modelled bytes and achieved bandwidth, max error against the "
                       "float64 reference. ONNX Runtime runs at its basic optimization level (so the fusions are "
                       "blockc's) and at its full level. Backends and peers that are not here are listed as skipped "
                       "with the reason.")
    _model_args(p)
    from .compare.peers import PEERS
    p.add_argument("--backends", default=",".join(compare_backends()), metavar="LIST",
                   help=f"comma-separated, from {', '.join(backend_names())} (default: "
                        f"{', '.join(compare_backends())}; those not here are skipped)")
    p.add_argument("--peers", default=",".join(PEERS), metavar="LIST",
                   help=f"comma-separated, from {', '.join(PEERS)}, or none (default: all that are installed and "
                        f"apply: ort-original needs an ONNX file)")
    p.add_argument("--batch", default="1", metavar="LIST", help="batch sizes, e.g. 1,8 (default 1)")
    p.add_argument("--seq", metavar="LIST",
                   help="sequence lengths, e.g. 128,512 (default 128, or the model's maximum where it is smaller)")
    _dim_arg(p, defaults=None, purpose=" other than batch and seq")
    _dtype_arg(p, choices=("float32", "float16"))
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="intra-op threads for ONNX Runtime and torch (default: the CPU count)")
    p.add_argument("--blocks", type=int, default=5, help="independent repetitions, each preparing a fresh session of "
                   "every contestant: ratios are geometric means over blocks with a 95%% interval (default 5; "
                   "fewer than 5 give no verdict)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved timing rounds in each block: every contestant "
                   "runs in each, so drift on a busy machine is shared and ratios are paired round by round (default 2)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up runs of each session (default 2)")
    p.add_argument("--repeats", type=int, default=4, help="at least this many timed runs of each session (default 4)")
    p.add_argument("--min-time", type=float, default=0.2, help="and at least this many seconds timed per session "
                   "(default 0.2)")
    p.add_argument("--max-memory", metavar="SIZE", help="memory the run may hold at once (the weights, the float64 reference and the sessions timed together), e.g. 8G "
                   "(default: half the memory available); a contestant that alone needs more is not run")
    _fused_as_arg(p, picks_form=False)
    p.add_argument("--peak-gbps", type=float, help="the device's peak memory bandwidth in GB/s, for a CPU "
                   "(GPUs' published peaks are known)")
    _weights_args(p)
    _json_arg(p, what="the results", schema="docs/compare-report.md")
    p.add_argument("--report", metavar="DIR", help="also write an HTML report with charts into DIR")
    p.add_argument("--no-kernels", action="store_true", help="skip timing each fused kernel alone")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (nor, where stderr is not a "
                   "terminal, the progress lines written there instead)")
    p.set_defaults(fn=cmd_compare)

    p = sub.add_parser("cache", help="list or clear the build cache",
                       description="List the build cache's entries (size, last use), most recent first, and its "
                       "total against its cap (BLOCKC_CACHE_MAX, default 10G; the least recently used entries go "
                       "after each build once the cache is over it). --clear removes every entry.")
    p.add_argument("--clear", action="store_true", help="remove every entry (those being built are left)")
    p.set_defaults(fn=cmd_cache)
    return parser


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """blockc's warnings as one escaped line, like its errors (not Python's
    two lines naming the file that raised them)."""
    from .errors import printable
    print(f"blockc: warning: {printable(str(message))}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    import warnings

    from .errors import printable
    parser = build_parser()
    shown = warnings.showwarning
    if argv is None:   # the program itself, not a caller that may record warnings (pytest.warns)
        warnings.showwarning = _show_warning
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parser.parse_args(argv)  # an option's type= may raise BlockcError (--arch)
        args.argv = argv  # as typed, for reports that record their command
        if getattr(args, "command", None) == "check" and not args.backend:
            args.backend = ["reference", "ort"]
        if not getattr(args, "fn", None):
            parser.print_help()
            return 0
        _resolve_forms(args)
        if hasattr(args, "seed"):   # before any work: numpy would refuse it at the first draw, as a traceback
            from .frontends.module import check_seed
            check_seed(args.seed, "--seed")
        _check_outputs(args)
        return args.fn(args)
    # The one place errors reach the terminal: names from weight files and
    # models in a message are shown escaped, never interpreted (a name
    # "\x1b[31m" must not turn the terminal red). Line breaks are blockc's own.
    except BlockcError as e:
        print(f"blockc: error: {printable(str(e), keep_newlines=True)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `blockc show gpt2 | head`
        sys.stderr.close()
        return 0
    except OSError as e:  # the machine, not blockc: a full disk, a folder that cannot be made
        where = f"{e.filename}: " if e.filename else ""
        print(f"blockc: error: {printable(where + (e.strerror or str(e)))}", file=sys.stderr)
        return 2
    except MemoryError:
        print("blockc: error: out of memory (make the model or the sizes smaller with --set or --dim)",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("blockc: interrupted", file=sys.stderr)
        return 130
    finally:
        warnings.showwarning = shown


if __name__ == "__main__":
    sys.exit(main())
