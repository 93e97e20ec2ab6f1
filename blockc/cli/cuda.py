"""``blockc cuda``: CUDA C++ for the model, proved to compile."""
from __future__ import annotations

from ..errors import BlockcError
from .common import dim_bindings, make_graph, make_weights, write_text
from .options import dim_arg, dtype_arg, gemm_arg, graph_args, json_arg, weights_args

NAME = "cuda"
HELP = "generate CUDA C++ and prove it compiles"
DESCRIPTION = ("Generate CUDA C++ for MODEL into DIR (kernels from templates, a host file with a static memory "
               "plan and a C API, a weights file, build.sh), compile it with nvcc for each --arch and report every "
               "kernel's registers, spills and shared memory.")


def add_arguments(p) -> None:
    graph_args(p, default="fused")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="the build directory to write")
    p.add_argument("--arch", default="sm_80,sm_90", type=arch_list,
                   help="GPU architectures, comma-separated sm_XX (default sm_80,sm_90)")
    dtype_arg(p, choices=("float32", "float16", "bfloat16"))
    gemm_arg(p)
    dim_arg(p, defaults={"batch": 1, "seq": 128}, purpose=" for the memory-plan figures")
    weights_args(p, seeds="the weights")
    json_arg(p, what="the summary")
    p.add_argument("--no-compile", action="store_true", help="write the build without running nvcc")


def arch_list(text: str) -> str:
    """--arch, checked where it is parsed: comma-separated ``sm_XX`` (a
    ``BlockcError``, which argparse lets through, so it is blockc's one-line
    error rather than argparse's usage message)."""
    import re
    archs = [a.strip() for a in text.split(",") if a.strip()]
    bad = [a for a in archs if not re.fullmatch(r"sm_\d{2,3}[a-z]?", a)]
    if bad or not archs:
        from ..errors import printable
        raise BlockcError(f"--arch {printable(text)!s}: " + (f"{', '.join(repr(a) for a in bad)} is not a GPU "
                          "architecture" if bad else "no architecture given")
                          + "; give comma-separated sm_XX, e.g. --arch sm_80,sm_90")
    return ",".join(archs)


def check_outputs(args) -> None:
    from ..files import check_writable_dir
    check_writable_dir(args.output, "the build into", "-o")


def run(args) -> int:
    import json
    from ..version import __version__
    from ..codegen.cuda import build as cuda_build, toolchain
    from ..codegen.cuda.lower import generate
    from ..files import output_folder
    from ..report.cuda_summary import compile_report, format_cuda_summary
    archs = [a.strip() for a in args.arch.split(",") if a.strip()]
    if not args.no_compile and toolchain.find_nvcc().path:
        # one CUDA's nvcc and headers, and archs it builds for: refused before any work
        toolchain.check_archs(toolchain.find_toolkit().nvcc, archs)
    if args.dtype:
        args.set = list(args.set) + [f"dtype={args.dtype}"]
    model, graph = make_graph(args)
    weights = make_weights(args, model)
    bindings = dim_bindings(args, graph)
    cuda = generate(graph, weights, form=args.form, version=__version__, gemm=cuda_build.gpu_gemm(args.gemm),
                    tf32=args.tf32)
    # the build appears whole or not at all: a failed compile or Ctrl-C leaves no folder
    with output_folder(args.output, last="summary.json") as out:
        meta = cuda_build.write_build(cuda, str(out), archs=archs, bindings=bindings)
        summary = compile_report(cuda, meta, str(out / "model.cu"), archs, compile=not args.no_compile)
        if summary.get("compiled") is False:
            # nvcc named the files in the hidden folder, which goes with this error
            raise toolchain.ToolchainError(summary["error"].replace(str(out), args.output))
        write_text(str(out / "summary.json"), json.dumps(summary, indent=2) + "\n")
    if args.json:
        write_text(args.json, json.dumps(summary, indent=2) + "\n")
    print(format_cuda_summary(summary))
    print(f"\nwrote {args.output}: model.cu, blockc_cuda.h, blockc_model.h, weights.bin, model.json, summary.json, build.sh")
    return 0
