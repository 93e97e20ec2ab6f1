"""Writing a generated model to a directory, and building it.

A build directory holds:

* ``model.cu``        -- kernels and host code (the exact source for nvcc and for emulation);
* ``blockc_cuda.h``   -- the small runtime header it includes;
* ``blockc_model.h``  -- the C API, for a program that links the library (model.cu includes it too);
* ``weights.bin``     -- every parameter (and load-time result) in launch order;
* ``model.json``      -- inputs, outputs, symbols, kernels, the memory plan;
* ``build.sh``        -- the nvcc command that makes ``libblockc_model.so``.

Nothing is written until the whole model has been generated, and the files
are written under temporary names then renamed into place together
(``files.replace_together``), so an error leaves no partial build and a killed
one leaves nothing the next run does not clean.
"""
from __future__ import annotations

import json
import os
import shlex
import struct
import warnings
from typing import Mapping

import numpy as np

from ...errors import BlockcError
from ...files import cache_key, cache_root, replace_together, user_mode
from ...frontends.weights import contiguous
from . import toolchain
from .kernels.elementwise import ELEMENTWISE
from .kernels.gemm import EMULATED_GEMM, GPU_GEMM, GemmChoice
from .lower import CudaModel
from .templates import TEMPLATE_DIR

RUNTIME_HEADER = os.path.join(TEMPLATE_DIR, "blockc_cuda.h")
API_HEADER = os.path.join(TEMPLATE_DIR, "blockc_model.h")
ARCHS = ("sm_80", "sm_90")


def weights_blob(params: list) -> bytes:
    """``BLKCWTS1``, a count, a table of (offset, nbytes), then 256-aligned data."""
    header = b"BLKCWTS1" + struct.pack("<Q", len(params))
    table, chunks, offset = [], [], 0
    for _, array in params:
        data = contiguous(array).tobytes()   # a checkpoint's transposed view, tile by tile
        table.append(struct.pack("<QQ", offset, len(data)))
        pad = (-len(data)) % 256
        chunks.append(data + b"\0" * pad)
        offset += len(data) + pad
    head = header + b"".join(table)
    head += b"\0" * ((-len(head)) % 256)
    return head + b"".join(chunks)


def library_flags(gemm: GemmChoice, *, link: bool = True, toolkit: toolchain.Toolkit | None = None,
                  origin: str | None = None) -> list[str]:
    """What nvcc needs beyond its own toolkit for a build's GEMMs: cuBLASLt's
    headers and, to link, the library by its soname with a RUNPATH relative
    to ``origin`` (the folder the built library will be in) and absolute
    (``toolchain.find_cublas``: the toolkit or NVIDIA's wheel). Only
    cuBLASLt: no generated call needs the rest of cuBLAS."""
    if gemm.kind != "cublas":
        return []
    found = toolchain.find_cublas(toolkit)
    return found.compile_flags() + (found.link_flags(origin) if link else [])


def gpu_gemm(requested: str | None) -> str:
    """The GEMM a GPU build uses: ``requested``, else cuBLASLt where this
    machine has one, else the tiled kernel, with a one-line notice (a
    ``UserWarning``; the CLI prints it as ``blockc: warning: ...``)."""
    if requested:
        return requested
    try:
        toolchain.find_cublas()
    except toolchain.ToolchainError:
        warnings.warn("no cuBLASLt on this machine: GEMMs use the tiled kernel "
                      "(pip install 'blockc[cuda]' for cuBLASLt)", stacklevel=2)
        return EMULATED_GEMM
    return GPU_GEMM


def nvcc_command(toolkit: toolchain.Toolkit | None, archs=ARCHS, *, gemm: GemmChoice = GemmChoice(),
                 out: str = "libblockc_model.so", origin: str | None = None) -> list[str]:
    """The nvcc command that builds ``model.cu`` (in the current folder) into
    ``out``, which will be in ``origin``: SASS for each arch and PTX for the
    highest (``toolchain.gencode_flags``), the headers of ``toolkit``'s own
    release, cuBLASLt where the build uses it. ``toolkit`` None: plain
    ``nvcc`` from PATH (a build.sh for another machine)."""
    cmd = [toolkit.nvcc if toolkit else "nvcc", "-O3", "-std=c++17", "--shared", "-Xcompiler", "-fPIC",
           "-Xptxas", "-v", "-Werror", "all-warnings", *toolchain.gencode_flags(archs)]
    cmd += list(toolkit.include_flags) if toolkit else []
    return cmd + ["-o", out, "model.cu"] + library_flags(gemm, toolkit=toolkit, origin=origin)


def describe(model: CudaModel, bindings: Mapping[str, int] | None = None) -> dict:
    """The model.json content (and the summary's data)."""
    def t(v):
        return {"dtype": v.dtype.name, "shape": [str(d) for d in v.shape]}

    meta = {
        "schema": "blockc.cuda-model/1",
        "name": model.graph.name,
        "gemm": {"kind": model.gemm.kind, "tf32": model.gemm.tf32},
        "symbols": model.symbols,
        "inputs": [dict(name=n, **t(v)) for n, v in model.inputs],
        "outputs": [dict(name=n, **t(v)) for n, v in model.outputs],
        "params": [{"name": n, "dtype": str(a.dtype), "shape": list(a.shape)} for n, a in model.params],
        "launches": [{"kernel": c.name, "nodes": c.nodes, "ops": c.ops} for c in model.steps],
        # what the lowering's elementwise fusion made: one kernel for a chain of elementwise IR ops
        "elementwise_chains": [{"kernel": c.name, "nodes": c.nodes, "ops": c.ops} for c in model.steps
                               if len(c.ops) > 1 and c.family is ELEMENTWISE],
        "kernels": {name: {"functions": c.kernels, "ops": c.ops} for name, c in model.kernels.items()},
        "memory_plan": {"slots": len(model.plan.slots), "buffers": sum(len(s.buffers) for s in model.plan.slots)},
    }
    if bindings:
        meta["memory_plan"].update(dims=dict(bindings), arena_bytes=model.plan.arena_bytes(bindings),
                                   naive_bytes=model.plan.naive_bytes(bindings))
    return meta


def write_build(model: CudaModel, out_dir: str, *, archs=ARCHS, bindings: Mapping[str, int] | None = None,
                weights: bool = True) -> dict:
    """Write the build directory: every file under a temporary name, then all
    renamed into place together (``files.replace_together``). ``build.sh``
    links the model's GEMM library (``library_flags``) where this machine has it.
    ``weights`` False: no ``weights.bin`` (a cache entry, shared by every model of
    the same graph: each run uploads its own weights at load)."""
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise BlockcError(f"cannot write {out_dir}: {e.strerror or e}") from None
    meta = describe(model, bindings)
    toolkit = toolchain.toolkit_or_none()
    try:
        command = nvcc_command(toolkit, archs, gemm=model.gemm, origin=out_dir)
        note = ""
    except toolchain.ToolchainError as e:
        # The source is still worth writing: build.sh then expects a toolkit with cuBLASLt on its paths.
        command = nvcc_command(toolkit, archs) + ["-lcublasLt"]
        note = "# " + str(e).splitlines()[0] + "\n"
    files = {
        "model.cu": model.source.encode(),
        "blockc_cuda.h": open(RUNTIME_HEADER, "rb").read(),
        "blockc_model.h": open(API_HEADER, "rb").read(),
        "model.json": (json.dumps(meta, indent=2) + "\n").encode(),
        "build.sh": ("#!/bin/sh\n# Builds libblockc_model.so with nvcc (set NVCC to override).\n" + note
                     + "set -e\ncd \"$(dirname \"$0\")\"\n"
                     + " ".join(["\"${NVCC:-nvcc}\""] + [shlex.quote(a) for a in command[1:]]) + "\n").encode(),
    }
    if weights:
        files["weights.bin"] = weights_blob(model.params)
    targets = [os.path.join(out_dir, name) for name in files]
    with replace_together(targets) as staged:
        for path, data in zip(staged, files.values()):
            with open(path, "wb") as f:
                f.write(data)
    os.chmod(os.path.join(out_dir, "build.sh"), user_mode(executable=True))
    return meta


def source_hash(model: CudaModel, *flags: str, compiler: str = "") -> str:
    """The cache key of a build of ``model``: everything that goes into it --
    the generated source, the runtime and API headers, the emulator's headers
    and sources, the build's ``flags`` and the ``compiler`` (its ``--version``)."""
    parts = [model.source.encode(), open(RUNTIME_HEADER, "rb").read(), open(API_HEADER, "rb").read()]
    for path in toolchain.emulator_files():
        parts += [path.name.encode(), path.read_bytes()]
    return cache_key(*parts, *flags, compiler)


def cache_dir() -> str:
    """Where built models are cached: ``files.cache_root()`` (``$BLOCKC_CACHE``)."""
    return str(cache_root())
