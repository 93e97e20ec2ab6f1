"""``blockc run``: the model on your inputs or seeded random ones."""
from __future__ import annotations

import sys
import time

import numpy as np

from .common import make_feeds, make_graph, make_weights
from .options import (dim_arg, fused_as_arg, gemm_arg, graph_args, provider_arg, tp_args, tp_backends_help,
                      weights_args)

NAME = "run"
HELP = "run the model on your inputs or seeded random ones"
DESCRIPTION = ("Run MODEL on the arrays of --inputs FILE.npz, on --text tokenized by its directory, or on seeded "
               "random inputs, print a summary of each output, and with --save write the outputs.")


def add_arguments(p) -> None:
    from ..parallel.launch import rank_backends
    from ..runtime.backend import backend_names
    graph_args(p)
    tp_args(p)
    p.add_argument("--backend", choices=backend_names(),
                   help=f"reference: the numpy interpreter; ort: ONNX Runtime (default; ort-cpu, ort-cuda: with that "
                        f"provider); cuda: generated CUDA on a GPU; cuda-emu: the same CUDA source emulated on the "
                        f"CPU; {', '.join(rank_backends())}: the graph as a PyTorch module ({tp_backends_help()})")
    gemm_arg(p)
    fused_as_arg(p)
    provider_arg(p)
    p.add_argument("--inputs", metavar="FILE.npz",
                   help="run on these arrays, named after the model's inputs (numpy.savez); their shapes bind "
                        "the dims, and every mismatch with the model's inputs is listed")
    p.add_argument("--text", action="append", metavar="TEXT",
                   help="an encoder's input as text: input_ids, attention_mask and token_type_ids from the model "
                        "directory's tokenizer.json, padded as tokenizer(texts, padding=True) (repeatable: one row each)")
    p.add_argument("--save", metavar="FILE.npz", help="write the outputs, by name, to this .npz file")
    dim_arg(p, defaults={"batch": 2, "seq": 16})
    weights_args(p, seeds="the weights, and of the inputs where --inputs gives none")
    p.add_argument("--float64", action="store_true", help="reference backend: compute in float64 (refused on others)")
    p.add_argument("--check", action="store_true", help="also report each output's max error against the "
                   "float64 reference")


def run(args) -> int:
    from ..errors import printable
    from ..frontends.module import InputSpec  # noqa: F401  (documented input sampling)
    from ..report.numerics import max_abs_error, run_check_failure
    from ..runtime.backend import make_backend
    from ..runtime.reference import run_reference
    if args.tp is not None:
        from .tensor_parallel import run_ranks
        return run_ranks(args)
    args.backend = args.backend or "ort"
    backend = make_backend(args.backend, **args.backend_options)   # an option it does not take: refused first
    model, graph = make_graph(args)
    weights = make_weights(args, model)
    feeds, bindings = make_feeds(args, model, graph)
    backend.require()
    seconds, weights, outputs = build_and_run(backend, graph, weights, feeds)
    dims = ", ".join(f"{k}={v}" for k, v in bindings.items())
    source = f"inputs {args.inputs}" if args.inputs else "--text" if args.text else f"seed {args.seed}"
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
        from ..runtime.feeds import save_npz
        save_npz(args.save, outputs)
        print(f"wrote {args.save}")
    failure = run_check_failure(graph, weights, feeds, outputs, oracle, backend.title) if oracle else ""
    if failure:
        print(f"blockc: check failed: {failure}", file=sys.stderr)
    return 1 if failure else 0


def build_and_run(backend, graph, weights, feeds) -> tuple[dict[str, float], dict, dict]:
    """``(seconds, weights, outputs)``: making the weights (seeded ones are
    made on access: all now, once, not inside the build or the run),
    compiling ``graph`` with them as a graph run once (``CompileHints``:
    ONNX Runtime does not prepack it), then one run of ``feeds``, each timed
    apart; the feeds are checked before any of it (a bad feed should not
    cost a build)."""
    from ..frontends.weights import materialize
    from ..runtime.backend import CompileHints
    from ..runtime.bindings import bind_inputs
    bindings = bind_inputs(graph, feeds)
    t0 = time.perf_counter()
    weights = materialize(weights)
    t1 = time.perf_counter()
    with backend.compile_hinted(graph, weights, CompileHints(runs=1)) as compiled:
        run = compiled.unchecked_runner(feeds, bindings)
        t2 = time.perf_counter()
        outputs = run()
        t3 = time.perf_counter()
    return {"weights made": t1 - t0, "build": t2 - t1, "first run": t3 - t2}, weights, outputs
