"""What a comparison ran on: the CPU, memory, GPU, library versions, and the
device's peak memory bandwidth where it is known.

Peak bandwidths are the vendors' published figures for the memory system
(HBM or GDDR), the denominator of "fraction of peak". A CPU's peak depends on
its memory channels and DIMMs, which software cannot read reliably, so for a
CPU the peak is unknown unless the user gives it (``--peak-gbps``).
"""
from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess

from ..version import __version__

# GB/s (10^9 bytes per second), the data-sheet figures. Matched by substring of
# the name nvidia-smi reports, most specific first.
GPU_PEAK_GBPS = (
    ("H200", 4800.0),
    ("H100 PCIe", 2000.0),
    ("H100 NVL", 3900.0),
    ("H100", 3350.0),   # SXM5
    ("GH200", 4000.0),
    ("A100-SXM4-80GB", 2039.0),
    ("A100-PCIE-80GB", 1935.0),
    ("A100", 1555.0),   # the 40 GB parts
    ("L40S", 864.0),
    ("L4", 300.0),
    ("A10G", 600.0),
    ("A10", 600.0),
    ("RTX 4090", 1008.0),
    ("V100", 900.0),
    ("T4", 320.0),
)


def gpu_peak_gbps(name: str) -> float | None:
    """The published peak memory bandwidth of the GPU called ``name``, if listed."""
    for key, gbps in GPU_PEAK_GBPS:
        if key.lower() in name.lower():
            return gbps
    return None


def gpu_name() -> tuple[str | None, str]:
    """(the first GPU's name, or None; why not when None)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None, "no NVIDIA GPU found (nvidia-smi not found)"
    try:
        out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"nvidia-smi failed: {e}"
    names = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    if out.returncode != 0 or not names:
        return None, "nvidia-smi sees no GPU"
    return names[0], ""


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


def version_of(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def describe_machine(*, gpu: str | None, peak_gbps: float | None) -> dict:
    """The ``machine`` object of the comparison's JSON.

    ``peak_gbps`` given by the user wins; else a used GPU's published peak;
    else unknown.
    """
    if peak_gbps is not None:
        peak, source = peak_gbps, "given with --peak-gbps"
    elif gpu is not None and gpu_peak_gbps(gpu) is not None:
        peak, source = gpu_peak_gbps(gpu), f"published peak of the {gpu}"
    elif gpu is not None:
        peak, source = None, f"no published peak listed for {gpu}; pass --peak-gbps"
    else:
        peak, source = None, "unknown for a CPU; pass --peak-gbps"
    return {"cpu": cpu_name(), "cores": os.cpu_count(), "memory_gib": memory_gib(),
            "os": platform.platform(terse=True), "python": platform.python_version(), "gpu": gpu,
            "peak_gbps": peak, "peak_source": source}


def versions() -> dict:
    ort = version_of("onnxruntime-gpu") or version_of("onnxruntime")
    return {"blockc": __version__, "numpy": version_of("numpy"), "onnxruntime": ort,
            "torch": version_of("torch")}


_RATE: list[float] = []


def matmul_flops_per_s() -> float:
    """This machine's float32 matmul rate through numpy (measured once, ~50 ms):
    what ``compare`` guesses a run's time from, to say up front how long it takes.

    The best of as many products as fit in 50 ms, not of a fixed few: five
    take 2 ms, all of which another process's time slice can cover. Even so,
    with every core busy numpy's threaded product waits on its slowest
    thread every time, and a rate 25x too low made a 38-minute compare
    announce 955 minutes. Contention only ever makes the rate lower, so the
    best one measured on this machine (CPU, cores, numpy) is kept in the
    cache and the higher of it and today's is used."""
    if not _RATE:
        _RATE.append(_best_recorded_rate(_measure_rate()))
    return _RATE[0]


def _measure_rate() -> float:
    import time

    import numpy as np
    a = np.ones((384, 384), dtype=np.float32)
    a @ a
    best, start = float("inf"), time.perf_counter()
    while time.perf_counter() - start < 0.05:
        t0 = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - t0)
    return 2 * 384 ** 3 / max(best, 1e-9)


def _best_recorded_rate(measured: float) -> float:
    """The higher of ``measured`` and the best this machine recorded before,
    which it records; where the cache cannot be read or written, ``measured``."""
    def best(known):
        return max(measured, known) if isinstance(known, (int, float)) and known > 0 else measured
    return update_record("matmul-rate.json", best, fallback=measured)


def machine_key() -> str:
    """What a record of this machine's speed is kept under: its CPU, its cores, its numpy."""
    return f"{cpu_name()} | {os.cpu_count()} cores | numpy {version_of('numpy')}"


def update_record(filename: str, update, *, fallback):
    """This machine's entry in the cache file ``filename`` (a JSON object
    keyed by ``machine_key``), replaced by ``update(entry or None)`` under a
    lock, and returned. Where the cache cannot be read or written,
    ``fallback``; an unreadable file is started again."""
    import json

    from ..errors import BlockcError
    from ..files import atomic_write, cache_root, file_lock
    key = machine_key()
    try:
        path = cache_root() / filename
        with file_lock(path.with_suffix(".lock")):
            try:
                known = json.loads(path.read_text())
                known = known if isinstance(known, dict) else {}
            except (OSError, ValueError):
                known = {}
            new = update(known.get(key))
            if new != known.get(key):
                with atomic_write(path, "w") as f:
                    json.dump({**known, key: new}, f)
            return new
    except (BlockcError, OSError):
        return fallback
