"""What several commands do with their arguments: the model they name, its
graph in the asked form, its weights, the sizes --dim binds, the inputs, and
the files they write."""
from __future__ import annotations

import os
import sys

import numpy as np

from ..errors import BlockcError
from .options import optimize_options


def load_model(args):
    """The model the arguments name, not traced."""
    from ..frontends import build_model
    from ..frontends.catalog import parse_sets
    return build_model(args.model, parse_sets(args.set))


def hf_dir_of(args) -> str | None:
    """The Hugging Face directory MODEL names (its tokenizer, chat template and
    generation config live there), else None."""
    from ..frontends.hf_dir import is_hf_dir
    return args.model if is_hf_dir(args.model) else None


def trace_model(args, progress=None):
    """The model and its trace (refused first if its graph cannot fit: ``trace``)."""
    from ..frontends import trace
    model = load_model(args)
    return model, trace(model, progress=progress)


def make_graph(args, progress=None):
    """The model and its graph in the asked form: from the compile cache
    without tracing where a built-in model's form was kept (``form_of``)."""
    from ..frontends import trace
    from ..frontends.trace_key import trace_key
    from ..passes.forms import form_of
    from ..ir.verify import verify

    model = load_model(args)
    form = getattr(args, "form", "standard")
    if form != "fused" and (getattr(args, "disable", None) or getattr(args, "print_after", None)
                            or getattr(args, "print_after_all", False)):
        raise BlockcError("--disable/--print-after apply to --form fused")
    graph = form_of(trace_key(model), lambda: trace(model, progress=progress), form, progress=progress,
                    **(optimize_options(args) if form == "fused" else {}))
    verify(graph)
    return model, graph


def make_weights(args, model):
    from ..frontends import init_weights
    if getattr(args, "weights", None):
        from ..frontends.weights import check_weights, load_weights
        weights = load_weights(args.weights)
        check_weights(model, weights)
        return weights
    from ..frontends.module import check_weights_fit
    check_weights_fit(model)  # before numpy tries to allocate them
    return init_weights(model, seed=args.seed)


def parse_dims(items: list[str] | None) -> dict[str, int]:
    """``["seq=128"]`` -> ``{"seq": 128}``; sizes are checked by their users."""
    from ..frontends.settings import parse_pairs
    pairs = parse_pairs(items, "--dim", "NAME=INT", "seq=128", valid=lambda v: v.lstrip("-").isdigit())
    return {key: int(value) for key, value in pairs.items()}


def asked_dims(args, graph) -> dict[str, int]:
    """The sizes --dim asks for, each checked to name a dimension of the model."""
    dims = parse_dims(args.dim)
    symbols = graph.symbols()
    unknown = [k for k in dims if k not in symbols and k not in ("batch", "seq")]
    if unknown:
        raise BlockcError(f"--dim {', '.join(unknown)}: the model has no such dimension "
                          f"(its dimensions: {', '.join(symbols)})")
    for k, v in dims.items():
        if v <= 0:
            raise BlockcError(f"--dim {k}={v}: dimensions must be positive")
    return dims


def dim_bindings(args, graph) -> dict[str, int]:
    """The command's default sizes (declared with its --dim), overridden by
    --dim, held to the limits the graph's tables set (``ops/limits.py``)."""
    from ..ops.limits import graph_limits
    bindings = dict(args.dim_defaults)
    # An imported ONNX file keeps its own dim names (batch_size, sequence_length):
    # those take the command's batch or seq default, whichever their name says.
    for name in graph.symbols():
        if name not in bindings:
            fallback = bindings.get("batch" if name.lower().startswith(("batch", "n")) else "seq")
            if fallback is not None:
                bindings[name] = fallback
    asked = asked_dims(args, graph)
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


def make_feeds(args, model, graph) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """``(feeds, bindings)``: the arrays of --inputs, checked against the
    graph's inputs (their shapes bind the dims), or inputs sampled as each
    ``InputSpec`` says from --seed at the --dim sizes."""
    from ..files import check_writable
    from ..runtime.feeds import check_feeds, load_npz
    if getattr(args, "save", None):
        check_writable(args.save)  # now, not after the run
    if getattr(args, "text", None):
        return text_feeds(args, graph)
    if not getattr(args, "inputs", None):
        bindings = dim_bindings(args, graph)
        rng = np.random.default_rng(args.seed)
        return {s.name: s.sample(bindings, rng) for s in model.inputs()}, bindings
    return check_feeds(graph, load_npz(args.inputs), dims=asked_dims(args, graph),
                       source=f"the arrays of {args.inputs}")


def text_feeds(args, graph) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """``(feeds, bindings)`` of --text: tokenized by MODEL's directory, padded as ``tokenizer(texts, padding=True)``."""
    from ..generate.text import TextTokenizer, text_feeds
    from ..runtime.feeds import check_feeds
    if args.inputs:
        raise BlockcError("--text and --inputs both give the inputs: give one of them")
    directory = hf_dir_of(args)
    if directory is None:
        raise BlockcError(f"--text needs a Hugging Face directory as MODEL, for its tokenizer.json "
                          f"(not {args.model!r}): give the arrays with --inputs")
    arrays = text_feeds(TextTokenizer.from_dir(directory), args.text, [v.name for v in graph.inputs])
    return check_feeds(graph, arrays, dims=asked_dims(args, graph), source="--text")


def int_list(flag: str, text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise BlockcError(f"malformed {flag} {text!r}: expected integers separated by commas, e.g. {flag} 1,8") from None
    if not values:
        raise BlockcError(f"{flag} needs at least one integer")
    return values


def inside(path: str, folder: str | None) -> bool:
    """Whether ``path`` lies in ``folder`` (or below it)."""
    if not folder:
        return False
    folder = os.path.abspath(folder)
    return os.path.commonpath([os.path.abspath(path), folder]) == folder


def write_text(path: str, text: str) -> None:
    """Write atomically: a failed write leaves no partial file."""
    from ..files import atomic_write
    with atomic_write(path, "w") as f:
        f.write(text)
