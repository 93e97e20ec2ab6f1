"""The options that several commands take, each declared once, here, by one
function. Its help is the same on every command, except through the
function's named parameters (what --seed seeds, the --dim defaults):
tests/test_cli_options.py holds both to that. Options one command alone
takes are declared in that command's module."""
from __future__ import annotations

import argparse
import sys

from ..errors import BlockcError


def model_args(p: argparse.ArgumentParser) -> None:
    """MODEL and --set."""
    from ..frontends.catalog import DEFAULT_MODEL
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL, metavar="MODEL",
                   help=f"a built-in model (see `blockc models`), path/to/file.py:name, path/to/model.onnx or a "
                        f"Hugging Face checkpoint directory (default: {DEFAULT_MODEL})")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a model setting, e.g. --set layers=2 --set d_model=64 (repeatable)")


def form_arg(p: argparse.ArgumentParser, *, default: str = "standard", start: bool = False) -> None:
    """--form: the graph form a command works on (``default`` when not given).

    ``start``: the command optimizes the graph itself (check, fusions), so
    --form is the form the fusions start from and ``fused`` is not offered.
    The default is applied by ``resolve_forms``, which must know whether
    --form was given.
    """
    from ..passes.forms import FORMS
    choices = tuple(f for f in FORMS if f != "fused") if start else FORMS
    meanings = {"standard": "norms, softmax and GELU as single ops", "decomposed": "primitive math",
                "fused": "through the optimization pipeline"}
    listed = ", ".join(f"{f} ({meanings[f]})" for f in choices)
    p.add_argument("--form", choices=choices, default=None,
                   help=f"the graph form{' the fusions start from' if start else ''}: {listed} (default {default})")
    p.set_defaults(form_default=default)


def fused_as_arg(p: argparse.ArgumentParser, *, all_forms: bool = False, picks_form: bool = True) -> None:
    """--fused-as: how fused ops are written in ONNX.

    ``all_forms`` adds ``all`` (check: every encoding in turn). ``picks_form``:
    the command's --form decides whether there are fused ops at all (export,
    run), so --fused-as alone means --form fused and an unfused --form with
    it is refused (``resolve_forms``). Without it (check, fusions, compare)
    the command makes fused ops whatever --form says.
    """
    from ..codegen.fused_encodings import ENCODINGS
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


def provider_arg(p: argparse.ArgumentParser) -> None:
    """--provider; None until ``resolve_forms``, so that a backend gets it only where it was given."""
    p.add_argument("--provider", choices=("cpu", "cuda", "auto"), default=None,
                   help="ONNX Runtime execution provider (default cpu)")
    p.set_defaults(provider_default="cpu")


def weights_args(p: argparse.ArgumentParser, *, seeds: str = "the weights and inputs") -> None:
    """--seed and --weights; ``seeds`` says what the seed makes on this command."""
    p.add_argument("--seed", type=int, default=0, help=f"seed of {seeds} (default 0)")
    p.add_argument("--weights", metavar="FILE",
                   help="a .safetensors or .npz file of weights to use instead of seeded ones")


def dim_arg(p: argparse.ArgumentParser, *, defaults: dict[str, int] | None, purpose: str = "") -> None:
    """--dim NAME=INT. ``defaults``: the sizes ``common.dim_bindings`` starts from on this
    command (stated once, here, for the help and the code); ``purpose``: what
    the sizes are for, where that is not running the model."""
    if defaults:
        p.set_defaults(dim_defaults=defaults)
    said = ", ".join(f"{k}={v}" for k, v in defaults.items()) if defaults else "none"
    p.add_argument("--dim", action="append", metavar="NAME=INT",
                   help=f"bind a symbolic dimension{purpose} (repeatable; default {said})")


def gemm_arg(p: argparse.ArgumentParser) -> None:
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


def given_backend_options(args) -> dict:
    """The backend options the command line gave, read before ``resolve_forms``
    fills in defaults: each goes to the backend only when given, and a
    backend refuses one it does not take (``make_backend``), rather than
    ignoring it."""
    return {k: getattr(args, k) for k in BACKEND_FLAGS if getattr(args, k, None) not in (None, False)}


def dtype_arg(p: argparse.ArgumentParser, *, choices: tuple[str, ...]) -> None:
    """--dtype; ``choices``: the dtypes the command's targets support."""
    p.add_argument("--dtype", choices=choices, help="the model's dtype, as --set dtype= (default: the model's own)")


def json_arg(p: argparse.ArgumentParser, *, what: str, schema: str | None = None) -> None:
    p.add_argument("--json", metavar="FILE",
                   help=f"also write {what} as JSON to FILE" + (f" (schema: {schema})" if schema else ""))


def resolve_forms(args) -> None:
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


def tp_args(p: argparse.ArgumentParser) -> None:
    """--tp and --pad-vocab: the model split over tensor-parallel ranks (``passes/shard.py``)."""
    p.add_argument("--tp", type=int, metavar="N",
                   help="split the model over N tensor-parallel ranks (Megatron's split)")
    p.add_argument("--pad-vocab", action="store_true",
                   help="with --tp: pad a vocabulary that does not divide by N with zero rows")


def tp_backends_help() -> str:
    """What --backend(s) may be with --tp, for a command's help: the
    backends a rank runs, the default first, read from the registry as the
    parser is built (``parallel.launch.rank_backends``, which imports no torch)."""
    from ..parallel.launch import rank_backends
    first, *others = rank_backends()
    return f"with --tp {first}" + (f" by default, or {' or '.join(others)}" if others else "")


def check_tp(args) -> None:
    """--pad-vocab without --tp, refused before any work (``shard`` refuses
    the rest: a --tp under 1, what does not divide, more ranks than heads)."""
    if getattr(args, "pad_vocab", False) and getattr(args, "tp", None) is None:
        raise BlockcError("--pad-vocab pads the vocabulary to split it over --tp ranks: give --tp N with it")


def optimize_args(p: argparse.ArgumentParser) -> None:
    from ..passes.manager import pass_names
    g = p.add_argument_group("optimization", f"passes: {', '.join(pass_names())}")
    g.add_argument("--disable", action="append", default=[], metavar="PASS",
                   help="skip a pass, e.g. --disable fuse_attention (repeatable)")
    g.add_argument("--print-after", action="append", default=[], metavar="PASS",
                   help="print the IR after PASS (repeatable)")
    g.add_argument("--print-after-all", action="store_true", help="print the IR after every pass")


def optimize_options(args) -> dict:
    """--disable and the printing options, as given (``passes/forms.py``
    decides on their values whether the compile cache may serve them)."""
    return {"disable": getattr(args, "disable", []), "print_after": getattr(args, "print_after", None) or [],
            "print_after_all": getattr(args, "print_after_all", False), "out": sys.stderr}


def graph_args(p: argparse.ArgumentParser, *, default: str = "standard", start: bool = False) -> None:
    """MODEL, --set, --form and the optimization options: the graph a command
    works on (``default`` and ``start``: as ``form_arg``'s)."""
    model_args(p)
    form_arg(p, default=default, start=start)
    optimize_args(p)
