"""Prepared weights: arrays made from a checkpoint's tensors by a transform
that copies (a transpose, a column slice, a folded concat), made once into
one cache file and memory-mapped on every later run.

A weight that is a view of a ``.safetensors`` file reaches ONNX Runtime as
external data at its file offset (``weights.file_region``): mapped by ONNX
Runtime itself, shared by every session, never copied. A weight made in
memory is copied into each session instead, and made again on every start.
``prepared_arrays`` turns such made arrays into file views too: on the
first run each is made (``make(name)``) and streamed into
``$BLOCKC_CACHE/weights/KEY/prepared.safetensors``
(``weights.write_safetensors``, one tensor in memory at a time) under the
cache's one policy (``files.cached_entry``: built once under a lock,
checked by ``stat`` rather than by hashing gigabytes, pruned, listed and
cleared by ``blockc cache``); later runs map the file.

The key must name everything the arrays are made from. For a checkpoint's
tensors that is its files' ``source_identity`` (what ``stat`` says of
them: a rewritten checkpoint gets a new key, so cached values are never
taken for new ones) with the recipe of each array and
``version.code_version()``. A file written within the last two seconds is
"racy" (git's rule for its index): a rewrite within the filesystem's
timestamp tick could leave the same stat behind, so ``source_identity`` is
None and callers make their arrays in memory, caching nothing.
"""
from __future__ import annotations

import json
import math
import os
import time
import warnings
from pathlib import Path
from typing import Callable, Iterable, Mapping

import numpy as np

from ..errors import BlockcError, WeightsError, printable
from ..files import CACHE_COUNTS, EntryUse, cache_limit, cached_entry, format_bytes
from .weights import SafetensorsFiles, keep_with_maps, write_safetensors

KIND = "weights"   # the cache's folder, and the kind CACHE_COUNTS counts
FILE = "prepared.safetensors"
RACY_NS = 2_000_000_000   # a file changed this recently may change again without its stat changing


class UncachedWeightsWarning(UserWarning):
    """Prepared weights too large for the cache, made in memory on every run instead."""


def _now_ns() -> int:
    return time.time_ns()


def source_identity(paths: Iterable[str | os.PathLike]) -> str | None:
    """What ``stat`` says of each of ``paths`` (its real path, size, mtime,
    ctime, inode and device), as one text; None when any of them cannot be
    read or is racy (changed within ``RACY_NS`` of now, either way: a clock
    set back counts too), when nothing made from them may be cached."""
    now, parts = _now_ns(), []
    for path in paths:
        real = os.path.realpath(os.fspath(path))
        try:
            st = os.stat(real)
        except OSError:
            return None
        if abs(now - st.st_mtime_ns) < RACY_NS or abs(now - st.st_ctime_ns) < RACY_NS:
            return None
        parts.append([real, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev])
    return json.dumps(parts)


def prepared_arrays(key: str, specs: Mapping[str, tuple[np.dtype, tuple[int, ...]]],
                    make: Callable[[str], np.ndarray]) -> dict[str, np.ndarray]:
    """``{name: array}`` for every ``specs`` entry ``name: (dtype, shape)``:
    read-only views over ``$BLOCKC_CACHE/weights/KEY/prepared.safetensors``
    (``weights.file_region`` finds them), which is made on a miss by calling
    ``make(name)`` for each name in turn and streaming the result into it.
    ``key`` (a ``files.cache_key``) must name everything the arrays are made
    from (see the module docstring). Counted in
    ``files.CACHE_COUNTS["weights", "hit" | "miss"]``. A damaged file is
    made again. Where the cache cannot be written (an unusable
    ``BLOCKC_CACHE``, a full disk) the arrays are made in memory, as without
    a cache; so are arrays totalling more than half of ``files.cache_limit()``
    (an ``UncachedWeightsWarning``, shown once): kept, they would leave no
    room for the merges folded over them or for the compile cache, and the
    prune after each build would remove the entry the next run looks for. An error of ``make``'s own is raised as it is, and a made
    array of another dtype or shape than its spec is a ``WeightsError``."""
    if sum(np.dtype(dtype).itemsize * math.prod(shape) for dtype, shape in specs.values()) > cache_limit() // 2:
        # one text for every call, so Python shows it once per process
        warnings.warn(UncachedWeightsWarning(
            f"prepared weights over half the cache's cap ({format_bytes(cache_limit())}: BLOCKC_CACHE_MAX) "
            f"are made in memory on every run, not cached; a cap of twice their size keeps them"))
        return {name: make(name) for name in specs}
    failed: list[BaseException] = []

    def made(name: str) -> np.ndarray:
        try:
            return make(name)
        except BaseException as e:
            failed.append(e)
            raise
    try:
        return cached_entry(KIND, key, FILE, lambda tmp: write_safetensors(tmp, specs, made),
                            lambda entry: _views(entry, specs), verify="stat")
    except WeightsError:   # made arrays that do not fit their specs: the caller's mistake
        raise
    except (OSError, BlockcError):   # the cache's folder, lock or file
        if failed:
            raise
        return {name: make(name) for name in specs}


def _views(entry: Path, specs: Mapping[str, tuple[np.dtype, tuple[int, ...]]]) -> dict[str, np.ndarray]:
    """The arrays of the prepared file ``entry``, once its header holds
    ``specs`` exactly (else a ``WeightsError``: the entry is made again).
    The entry is in use (``files.EntryUse``) as long as the views live: ONNX
    Runtime opens the file by its path for each session made from them, so
    no prune may remove it meanwhile."""
    use = EntryUse(entry)
    files = SafetensorsFiles([entry])
    arrays = {name: files[name] for name in files}
    got = {name: (a.dtype, a.shape) for name, a in arrays.items()}
    want = {name: (np.dtype(dtype), tuple(int(d) for d in shape)) for name, (dtype, shape) in specs.items()}
    if got != want:
        wrong = sorted(set(got.items()) ^ set(want.items()), key=str)[:3]
        raise WeightsError(f"{entry}: the prepared weights do not match what was asked for "
                           f"({', '.join(printable(str(w)) for w in wrong)})")
    keep_with_maps(arrays.values(), use)
    files.close()
    return arrays
