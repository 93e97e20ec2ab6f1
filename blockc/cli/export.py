"""``blockc export``: the model as an ONNX file."""
from __future__ import annotations

import os
import time

from ..errors import BlockcError
from .common import make_graph, make_weights
from .options import fused_as_arg, graph_args, provider_arg, tp_args, weights_args
from .progress_bar import ProgressBar

NAME = "export"
HELP = "write the model as ONNX"
DESCRIPTION = ("Export MODEL as an ONNX file (standard ops, dynamic batch/seq, weights as initializers; external "
               "data past 2 GB).")


def add_arguments(p) -> None:
    graph_args(p)
    tp_args(p)
    p.add_argument("-o", "--output", required=True, help="the .onnx file to write")
    p.add_argument("--opset", type=int, help="ONNX opset (default: 21, or 23 for --fused-as onnx23)")
    fused_as_arg(p)
    provider_arg(p)
    weights_args(p, seeds="the weights")
    p.add_argument("--no-weights", action="store_true",
                   help="write the model only, its weights declared as external data in <output>.data "
                   "(laid out, not written): any size exports in seconds")


def check_outputs(args) -> None:
    from ..files import check_writable
    check_writable(args.output)


def run(args) -> int:
    from ..codegen.onnx_export import save_onnx
    if args.no_weights and args.weights:
        raise BlockcError("--no-weights and --weights contradict each other")
    # --print-after writes the IR to the terminal as the passes run: no bar under it
    with ProgressBar(show=not (args.print_after or args.print_after_all)) as progress:
        if args.tp is not None:
            from .tensor_parallel import export_ranks
            export_ranks(args, progress)
            return 0
        model, graph = make_graph(args, progress)
        weights = None if args.no_weights else make_weights(args, model)
        t0 = time.perf_counter()
        decisions = save_onnx(graph, weights, args.output, opset=args.opset, fused_as=args.fused_as,
                              provider=args.provider, progress=progress)
    forms = sorted({f"{d['op']}: {d['form']}" for d in decisions})
    print(f"wrote {args.output}: {len(graph.nodes)} IR nodes, {len(graph.params)} parameters, "
          f"{time.perf_counter() - t0:.2f} s" + (f"; fused ops as {', '.join(forms)}" if forms else ""))
    if args.no_weights:
        print(f"weights not written: they are declared in {os.path.basename(args.output)}.data, to be filled "
              "in by blockc.codegen.onnx_weights_file.save_onnx_weights")
    return 0
