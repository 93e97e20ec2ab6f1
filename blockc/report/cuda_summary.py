"""The ``blockc cuda`` summary: every kernel with ptxas's registers, spills
and shared memory per architecture, the launches, and the memory plan's
arena against the naive sum of all buffers."""
from __future__ import annotations

import os

from ..codegen.cuda.lower import CudaModel
from ..files import format_bytes


def families_of_functions(model: CudaModel) -> dict:
    """Each ``__global__`` function of the model -> the kernel family that
    emitted it; the summary's fused kernels (which must never spill, tests
    hold the generator to it) are those of families declared ``fused``."""
    return {f: code.family for code in model.kernels.values() for f in code.kernels}


def compile_report(model: CudaModel, meta: dict, source: str, archs: list[str], *, compile: bool = True) -> dict:
    from ..codegen.cuda import toolchain
    from ..codegen.cuda.build import library_flags
    summary = {"schema": "blockc.cuda-summary/1", "model": meta["name"], "archs": archs, "gemm": model.gemm.kind,
               "tf32": model.gemm.tf32,
               "launches": len(meta["launches"]), "kernels": [], "memory_plan": meta["memory_plan"],
               "elementwise_chains": meta["elementwise_chains"]}
    found = toolchain.find_nvcc()
    if not compile:
        summary["compiled"] = None
        summary["nvcc"] = "not run (--no-compile)"
        return summary
    if found.path is None:
        summary["compiled"] = None
        summary["nvcc"] = found.reason
        return summary
    summary["nvcc"] = found.path
    try:
        includes = [f"-I{os.path.dirname(os.path.abspath(source))}"] + library_flags(model.gemm, link=False)
        result = toolchain.compile_nvcc(source, archs, werror=True, extra_flags=includes)
    except toolchain.ToolchainError as e:
        summary["compiled"] = False
        summary["error"] = str(e)
        return summary
    summary["compiled"] = True
    families = families_of_functions(model)
    for k in sorted(result.kernels, key=lambda k: (k.short_name, k.demangled, k.arch)):
        summary["kernels"].append({
            "kernel": k.short_name, "function": k.demangled, "arch": k.arch, "registers": k.registers,
            "spill_store_bytes": k.spill_store_bytes, "spill_load_bytes": k.spill_load_bytes,
            "stack_frame_bytes": k.stack_frame_bytes, "shared_bytes": k.shared_bytes,
            "family": families[k.short_name].title if k.short_name in families else None,
            "fused": k.short_name in families and families[k.short_name].fused})
    summary["fused_spill_bytes"] = sum(k["spill_store_bytes"] + k["spill_load_bytes"]
                                       for k in summary["kernels"] if k["fused"])
    return summary


def format_cuda_summary(summary: dict) -> str:
    lines = [f"{summary['model']}: {summary['launches']} kernel launches, gemm={summary['gemm']}"
             + (" (TF32)" if summary.get("tf32") else "")]
    chains = summary.get("elementwise_chains", [])
    if chains:
        fused_ops = sum(len(c["ops"]) for c in chains)
        kinds = list(dict.fromkeys("+".join(c["ops"]) for c in chains))
        lines.append(f"elementwise fusion: {fused_ops} IR ops in {len(chains)} launches "
                     f"({', '.join(kinds[:4])}{', ...' if len(kinds) > 4 else ''})")
    mp = summary["memory_plan"]
    if "arena_bytes" in mp:
        dims = ", ".join(f"{k}={v}" for k, v in mp["dims"].items())
        saved = 1 - mp["arena_bytes"] / mp["naive_bytes"] if mp["naive_bytes"] else 0
        lines.append(f"memory plan: {mp['buffers']} buffers in {mp['slots']} slots; arena {format_bytes(mp['arena_bytes'])}"
                     f" against {format_bytes(mp['naive_bytes'])} for every buffer apart ({saved:.0%} less) at {dims}")
    if summary.get("compiled") is None:
        lines.append(f"nvcc: {summary['nvcc']}")
        return "\n".join(lines)
    if summary["compiled"] is False:
        lines.append(f"nvcc FAILED:\n{summary['error']}")
        return "\n".join(lines)
    lines.append(f"nvcc: {summary['nvcc']} ({', '.join(summary['archs'])}, warnings as errors): ok")
    lines.append(f"  {'kernel':<52} {'arch':<6} {'regs':>4} {'spill st/ld':>12} {'smem':>6}")
    for k in summary["kernels"]:
        func = k["function"].split("(")[0]
        lines.append(f"  {func[:52]:<52} {k['arch']:<6} {k['registers']:>4} "
                     f"{k['spill_store_bytes']:>5}/{k['spill_load_bytes']:<6} {k['shared_bytes']:>6}")
    lines.append(f"spills in fused kernels: {summary['fused_spill_bytes']} bytes")
    return "\n".join(lines)
