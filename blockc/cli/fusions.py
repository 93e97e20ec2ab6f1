"""``blockc fusions``: what fused, what did not and why."""
from __future__ import annotations

from .common import dim_bindings, make_weights, trace_model, write_text
from .options import dim_arg, fused_as_arg, graph_args, json_arg, optimize_options, provider_arg, tp_args, weights_args

NAME = "fusions"
HELP = "what fused, what did not and why"
DESCRIPTION = ("Optimize MODEL and report every fusion candidate: matched, or rejected with the reason; which "
               "original nodes went into which fused op; node counts and modelled memory traffic before and after.")


def add_arguments(p) -> None:
    graph_args(p, start=True)
    tp_args(p)
    dim_arg(p, defaults={"batch": 1, "seq": 128}, purpose=" for the traffic model")
    json_arg(p, what="the report", schema="docs/fusion-report.md")
    p.add_argument("--verbose", action="store_true", help="list every rejected candidate")
    fused_as_arg(p, picks_form=False)
    provider_arg(p)
    p.add_argument("--no-onnx-forms", action="store_true",
                   help="skip working out each fused op's ONNX form (it exports the model with seeded weights)")
    weights_args(p, seeds="the weights exported to work out the ONNX forms")


def run(args) -> int:
    import json
    from ..passes.forms import to_form
    if args.tp is not None:
        from ..report.fusions import ranks_report
        from .tensor_parallel import fusion_ranks
        report = ranks_report(args.model, fusion_ranks(args, lambda graph, weights: _report(args, graph, weights)),
                              pad_vocab=args.pad_vocab)
    else:
        model, traced = trace_model(args)
        report = _report(args, to_form(traced, args.form),
                         None if args.no_onnx_forms else make_weights(args, model))
    if args.json:
        write_text(args.json, json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0


def _report(args, graph, weights) -> dict:
    """The fusion report of ``graph`` (in the form the fusions start from), printed;
    each fused op's ONNX form worked out by exporting it with ``weights`` (None: not)."""
    from ..frontends.catalog import parse_sets
    from ..passes.manager import optimize
    from ..report.fusions import build_report, format_report
    result = optimize(graph, **optimize_options(args))
    decisions = []
    if weights is not None:  # which ONNX form each fused op gets, and why
        from ..codegen.onnx_export import export_onnx_decided
        decisions = export_onnx_decided(result.graph, weights, fused_as=args.fused_as,
                                        provider=args.provider).decisions
    report = build_report(args.model, graph, result, dim_bindings(args, graph), parse_sets(args.set), args.form,
                          onnx_encodings=decisions)
    print(format_report(report, verbose=args.verbose))
    return report
