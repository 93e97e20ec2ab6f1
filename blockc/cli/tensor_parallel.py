"""What the commands do with ``--tp N``: the model split over N
tensor-parallel ranks (``passes/shard.py``), shown, reported, exported, run
or generated from per rank. Each command's handler calls one function here
when ``args.tp`` is set; the work is the library's (``blockc.shard``,
``parallel/launch.py``, ``report/communication.py``, ``codegen/onnx_ranks.py``)."""
from __future__ import annotations

import dataclasses
import sys

from ..errors import BlockcError
from .common import load_model, make_feeds, make_weights, trace_model
from .options import optimize_options



def shard_model(args, progress=None):
    """``(model, traced, sharded)``: MODEL traced and split over ``args.tp`` ranks,
    each rank's graph in --form (``shard`` works on the unfused trace)."""
    from ..ir.verify import verify
    from ..passes.forms import to_form
    from ..passes.shard import shard
    model, traced = trace_model(args, progress)
    sharded = shard(traced, args.tp, pad_vocab=args.pad_vocab)
    form = getattr(args, "form", "standard")
    options = optimize_options(args) if form == "fused" else {}
    graphs = [to_form(g, form, **options) for g in sharded.graphs]
    for graph in graphs:
        verify(graph)
    return model, traced, dataclasses.replace(sharded, graphs=graphs)


def rank_header(rank: int, tp: int) -> str:
    return f"# rank {rank} of {tp}"


def show_ranks(args) -> int:
    """``blockc show --tp N``: each rank's IR under its header."""
    _, _, sharded = shard_model(args)
    for rank, graph in enumerate(sharded.graphs):
        sys.stdout.write(f"{rank_header(rank, sharded.tp)}\n{graph}")
    return 0


def summary_ranks(args) -> int:
    """``blockc summary --tp N``: each rank's parameter bytes, peak
    activations and collectives, beside the unsplit model's activations."""
    from ..frontends import trace
    from ..passes.shard import shard
    from ..report.communication import rank_summaries
    from ..report.footprint import footprint
    traced = trace(load_model(args))
    sharded = shard(traced, args.tp, pad_vocab=args.pad_vocab)
    bindings = {"batch": 1, "seq": 128}
    print(f"{args.model} over {args.tp} tensor-parallel ranks (activations and collectives of the standard-form "
          f"graphs at " + ", ".join(f"{k}={v}" for k, v in bindings.items())
          + f"; unsplit, {footprint(traced, bindings).activations:,} activation bytes at peak):")
    for row in rank_summaries(sharded, bindings):
        print(row.format())
    return 0


def export_ranks(args, progress=None) -> list[str]:
    """``blockc export --tp N``: one ONNX file per rank, each printed with its
    rank's parameter bytes (with --no-weights too); the paths written."""
    from ..codegen.onnx_ranks import NEEDS_COLLECTIVES, save_rank_onnx
    model, _, sharded = shard_model(args, progress)
    weights = None if args.no_weights else make_weights(args, model)
    paths = save_rank_onnx(sharded, weights, args.output, opset=args.opset, fused_as=args.fused_as,
                           provider=args.provider)
    for rank, (path, size) in enumerate(zip(paths, sharded.param_bytes())):
        print(f"wrote {path}: rank {rank} of {sharded.tp}, {size:,} parameter bytes")
    print(NEEDS_COLLECTIVES)
    return paths


def fusion_ranks(args, report_one) -> list[dict]:
    """``blockc fusions --tp N``: ``report_one(graph, weights)`` (the command's
    own report of one graph) for each rank, printed under its header."""
    model, _, sharded = shard_model(args)   # in the --form the fusions start from
    weights = None if args.no_onnx_forms else make_weights(args, model)
    reports = []
    for rank, graph in enumerate(sharded.graphs):
        print(rank_header(rank, sharded.tp))
        reports.append(report_one(graph, None if weights is None else sharded.rank_weights(weights, rank)))
    return reports


def run_ranks(args) -> int:
    """``blockc run --tp N [--backend torch-eager|torch-compile]``: the ranks
    started on this machine (``run_tp``); rank 0's outputs (every rank
    holds the gathered outputs), checked against the unsplit float64
    reference with --check."""
    from ..errors import printable
    from ..frontends.catalog import parse_sets
    from ..parallel.launch import run_tp
    from ..report.numerics import max_abs_error, run_check_failure
    from ..runtime.reference import run_reference
    args.backend = rank_backend(args)
    if args.disable or args.print_after or args.print_after_all:
        raise BlockcError("--tp runs every pass on each rank's graph: --disable and --print-after are not taken "
                          "with --tp")
    model, traced = trace_model(args)
    feeds, bindings = make_feeds(args, model, traced)
    outputs = run_tp(args.model, args.tp, feeds, overrides=parse_sets(args.set), seed=args.seed,
                     weights=args.weights, pad_vocab=args.pad_vocab, fused=args.form == "fused",
                     backend=args.backend)[0]
    print(f"{printable(traced.name)} [{args.form}] on {args.tp} ranks of {args.backend}, "
          + ", ".join(f"{k}={v}" for k, v in bindings.items()))
    weights = make_weights(args, model) if args.check else None
    oracle = run_reference(traced, weights, feeds, float64=True) if args.check else None
    for name, a in outputs.items():
        err = f", max |err| vs f64 {max_abs_error(a, oracle[name]):.3g}" if oracle else ""
        print(f"  {printable(name)}: {list(a.shape)} {a.dtype}{err}")
    if args.save:
        from ..runtime.feeds import save_npz
        save_npz(args.save, outputs)
        print(f"wrote {args.save}")
    failure = run_check_failure(traced, weights, feeds, outputs, oracle, f"{args.tp} ranks") if oracle else ""
    if failure:
        print(f"blockc: check failed: {failure}", file=sys.stderr)
    return 1 if failure else 0


def rank_backend(args) -> str:
    """The backend each rank runs: --backend, torch-eager where none is
    given. One a rank does not run, or a backend option (--fused-as,
    --provider, ...) it does not take, is refused as ``make_backend``
    refuses it, rather than ignored."""
    from ..parallel.launch import check_rank_backend
    from ..runtime.backend import make_backend
    backend = check_rank_backend(args.backend or None, option="--backend")
    make_backend(backend, **getattr(args, "backend_options", {}))
    return backend


def check_generate_ranks(args) -> None:
    """What ``generate --tp`` cannot honour, refused before any work: a
    backend a rank does not run, and an ONNX decoder file's cache pairs
    (the ranks split blockc's own decoder graphs)."""
    args.backend = rank_backend(args)
    if args.cache_pairs is not None:
        raise BlockcError("--tp splits blockc's own decoder graphs, which name their caches: --cache-pairs (an ONNX "
                          "decoder file's cache names) is not taken with --tp")


def generate_ranks(args, prompts: list[list[int]], choices: dict, on_token=None):
    """``blockc generate --tp N``: the generation on N ranks (``generate_tp``),
    rank 0 picking with ``choices`` (``generate``'s ``pick``, ``stop_id``,
    ``stopping``) for all, its tokens handed to ``on_token`` as they come;
    rank 0's ``Generation``."""
    from ..frontends.catalog import parse_sets
    from ..parallel.launch import generate_tp
    return generate_tp(args.model, args.tp, prompts, args.max_new, **choices, on_token=on_token, form=args.form,
                       cache=args.cache, cache_len=args.cache_len, backend=args.backend,
                       overrides=parse_sets(args.set), seed=args.seed, weights=args.weights,
                       pad_vocab=args.pad_vocab)[0]
