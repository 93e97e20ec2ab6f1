"""Runs a built blockc CUDA model in a child process (see cuda_runner.py).

argv: library path, weights path, io folder. The folder holds spec.json
(dims, inputs, outputs) and the inputs as raw bytes; outputs are written back
as raw bytes. A crash or an emulator abort kills only this process.
"""
import ctypes
import json
import os
import sys
import time

import numpy as np


def main() -> int:
    so, weights, io_dir = sys.argv[1:4]
    spec = json.load(open(os.path.join(io_dir, "spec.json")))
    lib = ctypes.CDLL(so)
    lib.blockc_create.restype = ctypes.c_void_p
    lib.blockc_create.argtypes = [ctypes.c_char_p]
    lib.blockc_last_error.restype = ctypes.c_char_p
    lib.blockc_device_alloc.restype = ctypes.c_void_p
    lib.blockc_device_alloc.argtypes = [ctypes.c_size_t]
    lib.blockc_device_free.argtypes = [ctypes.c_void_p]
    lib.blockc_copy_to_device.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    lib.blockc_copy_to_host.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    lib.blockc_run.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p),
                               ctypes.POINTER(ctypes.c_longlong), ctypes.c_void_p]
    lib.blockc_destroy.argtypes = [ctypes.c_void_p]

    model = lib.blockc_create(weights.encode())
    if not model:
        sys.stderr.write(f"blockc_create failed: {lib.blockc_last_error().decode()}\n")
        return 3
    device = []

    def alloc(n):
        p = lib.blockc_device_alloc(max(n, 1))
        if not p:
            raise MemoryError("device allocation failed")
        device.append(p)
        return p

    ins = []
    for item in spec["inputs"]:
        data = open(os.path.join(io_dir, item["file"]), "rb").read()
        p = alloc(len(data))
        buf = ctypes.create_string_buffer(data, len(data))
        lib.blockc_copy_to_device(p, buf, len(data))
        ins.append(p)
    outs = [alloc(item["nbytes"]) for item in spec["outputs"]]
    dims = (ctypes.c_longlong * max(len(spec["dims"]), 1))(*spec["dims"])
    in_arr = (ctypes.c_void_p * max(len(ins), 1))(*ins)
    out_arr = (ctypes.c_void_p * max(len(outs), 1))(*outs)
    def run_once() -> bool:
        if lib.blockc_run(model, in_arr, out_arr, dims, None) != 0:
            sys.stderr.write(f"blockc_run failed: {lib.blockc_last_error().decode()}\n")
            return False
        return True

    def synchronize() -> bool:
        if lib.blockc_synchronize() != 0:
            sys.stderr.write(f"blockc_run failed: {lib.blockc_last_error().decode()}\n")
            return False
        return True

    timing = spec.get("time")
    if timing:  # blockc compare: per-run times, each from the launch to a device synchronize
        for _ in range(int(timing["warmup"])):
            if not (run_once() and synchronize()):
                return 4
        times: list = []
        while len(times) < int(timing["min_repeats"]) or sum(times) < float(timing["min_time_s"]):
            t0 = time.perf_counter()
            if not (run_once() and synchronize()):
                return 4
            times.append(time.perf_counter() - t0)
            if len(times) >= 10_000:
                break
        with open(os.path.join(io_dir, "times.json"), "w") as f:
            json.dump(times, f)
    else:
        for _ in range(int(spec.get("repeats", 1))):
            if not run_once():
                return 4
        if not synchronize():
            return 4
    for item, p in zip(spec["outputs"], outs):
        buf = ctypes.create_string_buffer(item["nbytes"])
        lib.blockc_copy_to_host(buf, p, item["nbytes"])
        with open(os.path.join(io_dir, item["file"]), "wb") as f:
            f.write(buf.raw)
    for p in device:
        lib.blockc_device_free(p)
    lib.blockc_destroy(model)
    return 0


if __name__ == "__main__":
    np  # noqa: B018  (imported so a broken numpy fails here, not mid-run)
    sys.exit(main())
