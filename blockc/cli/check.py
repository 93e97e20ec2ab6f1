"""``blockc check``: the numeric A/B of every fusion."""
from __future__ import annotations

from .common import make_feeds, make_weights, trace_model
from .options import dim_arg, form_arg, fused_as_arg, gemm_arg, model_args, provider_arg, weights_args

NAME = "check"
HELP = "numeric A/B of every fusion"
DESCRIPTION = ("Run the unfused graph and the fused graph (each fusion alone, then all together) in float32 "
               "against the float64 reference; a fusion passes when its error is at most 2x the unfused error "
               "plus 1e-6. Exit status 1 on failure.")
DEFAULT_BACKENDS = ["reference", "ort"]


def add_arguments(p) -> None:
    from ..runtime.backend import backend_names
    model_args(p)
    form_arg(p, start=True)
    p.add_argument("--backend", action="append", choices=backend_names(),
                   help="backends to check on (repeatable; default: reference and ort)")
    fused_as_arg(p, all_forms=True, picks_form=False)
    provider_arg(p)
    gemm_arg(p)
    dim_arg(p, defaults={"batch": 2, "seq": 16})
    weights_args(p)


def run(args) -> int:
    from ..codegen.fused_encodings import ENCODINGS
    from ..passes.forms import to_form
    from ..report.numerics import check_fusions, format_check, fusion_variants
    from ..runtime.backend import backend_options, make_backend, split_options
    args.backend = args.backend or list(DEFAULT_BACKENDS)
    given = split_options(args.backend, args.backend_options)   # an option none of them takes: refused first
    model, traced = trace_model(args)
    graph = to_form(traced, args.form)
    weights = dict(make_weights(args, model))
    feeds = make_feeds(args, model, graph)[0]
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
