"""``blockc compare``: fused against unfused, measured side by side with the peers."""
from __future__ import annotations

from ..errors import BlockcError
from .common import int_list, parse_dims, write_text
from .options import (dim_arg, dtype_arg, fused_as_arg, json_arg, model_args, tp_args, tp_backends_help,
                      weights_args)
from .progress_bar import PROGRESS_LINE_S, ProgressBar

NAME = "compare"
HELP = "fused against unfused, measured side by side with the peers"
DESCRIPTION = ("Measure MODEL in every form (decomposed, standard, fused) on every available backend, and the peers "
               "(ONNX Runtime's transformer optimizer, on the file itself where MODEL is an ONNX file; that file "
               "unmodified on ONNX Runtime; PyTorch eager; torch.compile) on the same weights, shapes, threads and "
               "repeats: latency, speedup against the standard form, node and kernel counts, modelled bytes and "
               "achieved bandwidth, max error against the float64 reference. ONNX Runtime runs at its basic "
               "optimization level (so the fusions are blockc's) and at its full level. Backends and peers that are "
               "not here are listed as skipped with the reason. With --tp N: the torch backends' step, unfused and "
               "fused, split over N ranks beside one rank, in blocks of fresh sessions with an A/A control, the "
               "collectives' share of a step, and the split outputs checked against one rank's.")

# What ``compare --tp`` takes (``compare/tensor_parallel.py``); any other option given is refused.
TP_TAKES = ("model", "set", "tp", "pad_vocab", "backends", "batch", "seq", "seed", "weights", "json", "blocks",
            "rounds", "warmup", "repeats", "no_progress")


def add_arguments(p) -> None:
    from ..compare.peers import PEERS
    from ..runtime.backend import backend_names, compare_backends
    model_args(p)
    tp_args(p)
    p.add_argument("--backends", default=",".join(compare_backends()), metavar="LIST",
                   help=f"comma-separated, from {', '.join(backend_names())} (default: "
                        f"{', '.join(compare_backends())}; those not here are skipped; {tp_backends_help()})")
    p.add_argument("--peers", default=",".join(PEERS), metavar="LIST",
                   help=f"comma-separated, from {', '.join(PEERS)}, or none (default: all that are installed and "
                        f"apply: ort-original needs an ONNX file)")
    p.add_argument("--batch", default="1", metavar="LIST", help="batch sizes, e.g. 1,8 (default 1)")
    p.add_argument("--seq", metavar="LIST",
                   help="sequence lengths, e.g. 128,512 (default 128, or the model's maximum where it is smaller)")
    dim_arg(p, defaults=None, purpose=" other than batch and seq")
    dtype_arg(p, choices=("float32", "float16"))
    _timing_args(p)
    fused_as_arg(p, picks_form=False)
    p.add_argument("--peak-gbps", type=float, help="the device's peak memory bandwidth in GB/s, for a CPU "
                   "(GPUs' published peaks are known)")
    weights_args(p)
    json_arg(p, what="the results", schema="docs/compare-report.md")
    p.add_argument("--report", metavar="DIR", help="also write an HTML report with charts into DIR")
    p.add_argument("--no-kernels", action="store_true", help="skip timing each fused kernel alone")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (nor, where stderr is not a "
                   "terminal, the progress lines written there instead)")


def _timing_args(p) -> None:
    """How the contestants are measured: threads, blocks, rounds, repeats, memory."""
    p.add_argument("--threads", type=int, help="intra-op threads for ONNX Runtime and torch (default: "
                   "$BLOCKC_THREADS where set, else the CPU count)")
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


def check_outputs(args) -> None:
    if args.report:
        from ..report.compare_html import check_report_dir
        check_report_dir(args.report)


def _name_list(text: str) -> tuple[str, ...]:
    return () if text.strip().lower() == "none" else tuple(x.strip() for x in text.split(",") if x.strip())


def compare_options(args):
    """``blockc compare``'s flags as ``compare.CompareOptions``."""
    import shlex

    from ..compare import CompareOptions
    from ..files import parse_size
    given = {} if args.threads is None else {"threads": args.threads}   # else CompareOptions' default
    return CompareOptions(
        model=args.model, settings=args.set, dtype=args.dtype, backends=_name_list(args.backends),
        peers=_name_list(args.peers), batches=int_list("--batch", args.batch),
        seqs=None if args.seq is None else int_list("--seq", args.seq),
        dims=parse_dims(args.dim), **given, warmup=args.warmup, min_repeats=args.repeats,
        min_time_s=args.min_time, rounds=args.rounds, blocks=args.blocks,
        max_memory=None if args.max_memory is None else parse_size(args.max_memory, "--max-memory"),
        fused_as=args.backend_options.get("fused_as"), peak_gbps=args.peak_gbps, seed=args.seed,
        weights=args.weights, kernels=not args.no_kernels, command="blockc " + shlex.join(args.argv))


def run_tp(args) -> int:
    """``compare --tp N``: what ``compare/tensor_parallel.py`` measures, printed and
    written; 1 where the split outputs are not the unsplit ones."""
    import json
    import sys

    from ..compare.tensor_parallel import compare_tp, format_tp, output_failure
    from ..frontends.catalog import parse_sets
    _refuse_outside_tp(args)
    batches, seqs = int_list("--batch", args.batch), int_list("--seq", args.seq or "128")
    if len(batches) != 1 or len(seqs) != 1:
        raise BlockcError("compare --tp measures one shape: give one --batch and one --seq")
    backends = None if args.backends == _defaults()["backends"] else _name_list(args.backends)   # None: compare_tp's
    report = compare_tp(args.model, args.tp, overrides=parse_sets(args.set), backends=backends, batch=batches[0],
                        seq=seqs[0], seed=args.seed, weights=args.weights, pad_vocab=args.pad_vocab,
                        blocks=args.blocks, rounds=args.rounds, warmup=args.warmup, repeats=args.repeats)
    print(format_tp(report))
    if args.json:
        write_text(args.json, json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    failure = output_failure(report)
    if failure:
        print(f"blockc: check failed: {failure}", file=sys.stderr)
    return 1 if failure else 0


def _defaults() -> dict:
    """compare's options as they are when not given."""
    import argparse
    p = argparse.ArgumentParser()
    add_arguments(p)
    return vars(p.parse_args([]))


def _refuse_outside_tp(args) -> None:
    """An option ``compare --tp`` does not take, given, is refused rather than ignored."""
    given = [k for k, v in _defaults().items() if k not in TP_TAKES + ("fused_as",) and getattr(args, k) != v]
    given += ["fused_as"] if "fused_as" in args.backend_options else []
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise BlockcError(f"compare --tp runs every contestant a fixed count of steps on ranks in step: {flag} "
                          f"is not taken with --tp (it takes {', '.join('--' + k.replace('_', '-') for k in TP_TAKES[2:])})")


def run(args) -> int:
    import json

    from ..compare import plan_comparison, run_comparison
    if args.tp is not None:
        return run_tp(args)
    from ..compare.run import describe_plan
    from ..compare.table import make_console, print_report
    options = compare_options(args)
    # Everything a user can get wrong fails here, before any measuring (the output paths in check_outputs).
    plan = plan_comparison(options)
    console = make_console()
    for line in describe_plan(plan):
        console.print(line)
    with ProgressBar(delay=0, show=not args.no_progress, lines_every=PROGRESS_LINE_S) as bar:
        report = run_comparison(plan, bar)
    print_report(report, console)
    if args.report:   # first: the folder appears with it, and --json may name a file inside it
        from ..compare.pictures import block_graphs
        from ..report.compare_html import write_html_report
        before, after = block_graphs(options)
        page = write_html_report(report, args.report, before=before, after=after)
        print(f"wrote {page}")
    if args.json:
        write_text(args.json, json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    # a row the memory budget kept from running is "skipped", said in the table; only an error fails
    return 0 if all(r["status"] != "error" for r in report["results"] if not r["peer"]) else 1
