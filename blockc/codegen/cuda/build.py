"""Writing a generated model to a directory, and building it.

A build directory holds:

* ``model.cu``        -- kernels and host code (the exact source for nvcc and for emulation);
* ``blockc_cuda.h``   -- the small runtime header it includes;
* ``weights.bin``     -- every parameter (and load-time result) in launch order;
* ``model.json``      -- inputs, outputs, symbols, kernels, the memory plan;
* ``build.sh``        -- the nvcc command that makes ``libblockc_model.so``.

Nothing is written until the whole model has been generated, and files are
written under temporary names then renamed, so an error leaves no partial
build.
"""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import struct
import tempfile
from typing import Mapping

import numpy as np

from ...errors import BlockcError
from ...ops import registry
from .lower import CudaModel
from .templates import TEMPLATE_DIR

RUNTIME_HEADER = os.path.join(TEMPLATE_DIR, "blockc_cuda.h")
EMU_DIR = os.path.join(os.path.dirname(__file__), "emu")
ARCHS = ("sm_80", "sm_90")


def weights_blob(params: list) -> bytes:
    """``BLKCWTS1``, a count, a table of (offset, nbytes), then 256-aligned data."""
    header = b"BLKCWTS1" + struct.pack("<Q", len(params))
    table, chunks, offset = [], [], 0
    for _, array in params:
        data = np.ascontiguousarray(array).tobytes()
        table.append(struct.pack("<QQ", offset, len(data)))
        pad = (-len(data)) % 256
        chunks.append(data + b"\0" * pad)
        offset += len(data) + pad
    head = header + b"".join(table)
    head += b"\0" * ((-len(head)) % 256)
    return head + b"".join(chunks)


def nvcc_command(nvcc: str, archs=ARCHS, *, gemm: str = "tiled", out: str = "libblockc_model.so") -> list[str]:
    cmd = [nvcc, "-O3", "-std=c++17", "--shared", "-Xcompiler", "-fPIC", "-Xptxas", "-v", "-Werror", "all-warnings"]
    for arch in archs:
        cmd += ["-gencode", f"arch=compute_{arch[3:]},code={arch}"]
    cmd += ["-o", out, "model.cu"]
    if gemm == "cublas":
        cmd += ["-lcublas"]
    return cmd


def describe(model: CudaModel, bindings: Mapping[str, int] | None = None) -> dict:
    """The model.json content (and the summary's data)."""
    def t(v):
        return {"dtype": v.dtype.name, "shape": [str(d) for d in v.shape]}

    meta = {
        "schema": "blockc.cuda-model/1",
        "name": model.graph.name,
        "symbols": model.symbols,
        "inputs": [dict(name=n, **t(v)) for n, v in model.inputs],
        "outputs": [dict(name=n, **t(v)) for n, v in model.outputs],
        "params": [{"name": n, "dtype": str(a.dtype), "shape": list(a.shape)} for n, a in model.params],
        "launches": [{"kernel": c.name, "nodes": c.nodes, "ops": c.ops} for c in model.steps],
        # what the lowering's elementwise fusion made: one kernel for a chain of elementwise IR ops
        "elementwise_chains": [{"kernel": c.name, "nodes": c.nodes, "ops": c.ops} for c in model.steps
                               if len(c.ops) > 1 and all(registry.get(op).cuda == "elementwise" for op in c.ops)],
        "kernels": {name: {"functions": c.kernels, "ops": c.ops} for name, c in model.kernels.items()},
        "memory_plan": {"slots": len(model.plan.slots), "buffers": sum(len(s.buffers) for s in model.plan.slots)},
    }
    if bindings:
        meta["memory_plan"].update(dims=dict(bindings), arena_bytes=model.plan.arena_bytes(bindings),
                                   naive_bytes=model.plan.naive_bytes(bindings))
    return meta


def write_build(model: CudaModel, out_dir: str, *, archs=ARCHS, gemm: str = "tiled",
                bindings: Mapping[str, int] | None = None) -> dict:
    """Write the build directory atomically (file by file, renamed into place)."""
    os.makedirs(out_dir, exist_ok=True)
    meta = describe(model, bindings)
    nvcc = "nvcc"
    files = {
        "model.cu": model.source.encode(),
        "blockc_cuda.h": open(RUNTIME_HEADER, "rb").read(),
        "weights.bin": weights_blob(model.params),
        "model.json": (json.dumps(meta, indent=2) + "\n").encode(),
        "build.sh": ("#!/bin/sh\n# Builds libblockc_model.so with nvcc (set NVCC to override).\nset -e\n"
                     "cd \"$(dirname \"$0\")\"\n"
                     + " ".join(["\"${NVCC:-nvcc}\""] + [shlex.quote(a) for a in nvcc_command(nvcc, archs,
                                                                                             gemm=gemm)[1:]])
                     + "\n").encode(),
    }
    tmp = []
    try:
        for name, data in files.items():
            fd, path = tempfile.mkstemp(dir=out_dir, prefix=f".{name}.")
            tmp.append((path, os.path.join(out_dir, name)))
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        for path, final in tmp:
            os.replace(path, final)
        os.chmod(os.path.join(out_dir, "build.sh"), 0o755)
        os.chmod(os.path.join(out_dir, "model.json"), 0o644)
    except OSError as e:
        for path, _ in tmp:
            if os.path.exists(path):
                os.unlink(path)
        raise BlockcError(f"cannot write {out_dir}: {e.strerror}") from None
    return meta


def source_hash(model: CudaModel, *flags: str) -> str:
    h = hashlib.sha256(model.source.encode())
    h.update(open(RUNTIME_HEADER, "rb").read())
    for f in flags:
        h.update(f.encode())
    return h.hexdigest()[:16]


def cache_dir() -> str:
    base = os.environ.get("BLOCKC_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "blockc")
    os.makedirs(base, exist_ok=True)
    return base


def copy_emu_headers(out_dir: str) -> None:
    for name in os.listdir(EMU_DIR):
        if name.endswith((".h", ".cpp")):
            shutil.copy(os.path.join(EMU_DIR, name), os.path.join(out_dir, name))
