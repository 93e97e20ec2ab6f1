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
tensors that is its files' ``source_identity``: what ``stat`` says of the
files whose bytes were actually read (``files.stat_identity`` of the
``os.fstat`` taken when each was mapped, or its header read), so a
rewritten checkpoint gets a new key and cached values are never taken for
new ones; with the recipe of each array and ``version.code_version()``.
Nothing is cached (``source_identity`` None: the arrays are made in
memory) when a path no longer names the file that was read (replaced since:
``rsync``, ``cp`` and ``mv``, ``git checkout``), or when a file is "racy"
(``files.racy``, git's rule for its index: a rewrite within the
filesystem's timestamp tick could leave the same stat behind; not a
prepared file of this cache, whose bytes its key fixes: ``_own_entry``);
and an entry is not kept when the sources changed while it was being made.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import warnings
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from ..errors import BlockcError, WeightsError, printable
from ..files import (EntryUse, cache_key, cache_limit, cache_root, cached_entry, format_bytes, racy, same_file,
                     stat_identity)
from ..version import code_version
from .weights import SafetensorsFiles, keep_with_maps, write_safetensors

KIND = "weights"   # the cache's folder, and the kind CACHE_COUNTS counts
FILE = "prepared.safetensors"


class UncachedWeightsWarning(UserWarning):
    """Prepared weights too large for the cache, made in memory on every run instead."""


class _SpecMismatch(WeightsError):
    """A prepared entry's header unlike the specs asked for (``_views``)."""


class _SourcesChanged(BlockcError):
    """The sources changed while an entry was made from them: it is not kept (never shown to a user)."""


def source_identity(sources: Mapping[str, os.stat_result]) -> str | None:
    """What ``stat`` says of each file of ``sources`` (``{path: os.fstat of
    the file whose bytes are read}``, as ``weights.mapped_files`` or
    ``SafetensorsFiles.stats`` give it) with a sample of its content
    (``_content_sample``), as one text; None, when nothing
    made from them may be cached, when a path cannot be read, names another
    file now (replaced since it was read), or is racy (``files.racy``)."""
    parts = []
    for path, read in sorted(sources.items()):
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                now = stat_identity(st)
                if not same_file(read, st) or (racy(now) and not _own_entry(path)):
                    return None
                parts.append([path, *now, _content_sample(f.fileno(), now.size)])
        except OSError:
            return None
    return json.dumps(parts)


def _own_entry(path: str) -> bool:
    """Whether ``path`` is one of these prepared files, which the racy rule
    need not hold back: its bytes follow from its key (the path names its
    sources, its recipe and the code), and it is only ever replaced whole
    (``files.cached_entry``), by the same bytes. Merges folded over a
    checkpoint's casts (``runtime/folded_params.py``) are thus kept by the
    run that made the casts, seconds before, not left to every session of
    it and made by the next run."""
    try:
        entries = (cache_root() / KIND).resolve()
    except BlockcError:
        return False
    where = Path(path).resolve()
    return where.name == FILE and where.parent.parent == entries


SAMPLE_ENDS = 1 << 20                 # the first and the last MiB
SAMPLE_BLOCKS, SAMPLE_BLOCK = 16, 64 << 10   # and 16 strided blocks of 64 KiB: milliseconds for any size


def _content_sample(fd: int, size: int) -> str:
    """SHA-256 of a cheap sample of the file: its safetensors header, its
    first and last MiB and 16 strided 64 KiB blocks. Where ``stat`` cannot
    see a rewrite (a filesystem without real ctimes or inodes: FUSE object
    stores, some SMB mounts; a clock skewed past the racy rule) a new
    checkpoint of the same size still differs here (docs/CACHE.md)."""
    header_end = min(size, 8 + int.from_bytes(os.pread(fd, 8, 0), "little"))
    spans = [(0, max(header_end, SAMPLE_ENDS)), (size - SAMPLE_ENDS, SAMPLE_ENDS),
             *((i * size // SAMPLE_BLOCKS, SAMPLE_BLOCK) for i in range(SAMPLE_BLOCKS))]
    h = hashlib.sha256()
    for start, length in spans:
        start = max(0, start)
        h.update(os.pread(fd, max(0, min(length, size - start)), start))
    return h.hexdigest()


def prepared_arrays(recipe: str, specs: Mapping[str, tuple[np.dtype, tuple[int, ...]]],
                    make: Callable[[str], np.ndarray],
                    sources: Mapping[str, os.stat_result] | None = None) -> dict[str, np.ndarray] | None:
    """``{name: array}`` for every ``specs`` entry ``name: (dtype, shape)``:
    read-only views over ``$BLOCKC_CACHE/weights/KEY/prepared.safetensors``
    (``weights.file_region`` finds them), which is made on a miss by calling
    ``make(name)`` for each name in turn and streaming the result into it.
    KEY names everything the arrays are made from (see the module
    docstring): ``source_identity(sources)``, taken here once, ``recipe``
    (how each array is made from them, as text) and ``code_version()``;
    arrays made from no file (``sources`` None) are keyed by ``recipe``
    alone. None where nothing made from ``sources`` may be cached
    (``source_identity`` None): the caller makes what it needs as it would
    without a cache (nothing is made here). Counted in
    ``files.CACHE_COUNTS["weights", "hit" | "miss"]``. A damaged file is
    made again. Where the cache cannot be written (an unusable
    ``BLOCKC_CACHE``, a full disk) the arrays are made in memory, as without
    a cache; so are arrays totalling more than half of ``files.cache_limit()``
    (an ``UncachedWeightsWarning``, shown once): kept, they would leave no
    room for the merges folded over them or for the compile cache, and the
    prune after each build would remove the entry the next run looks for.
    An error of ``make``'s own is raised as it is, and a made array of
    another dtype or shape than its spec is a ``WeightsError``.
    ``sources`` (whose ``source_identity`` is part of KEY) are looked at
    again once the arrays are made: if they changed meanwhile, the entry is
    not kept and the arrays are made in memory."""
    if sum(np.dtype(dtype).itemsize * math.prod(shape) for dtype, shape in specs.values()) > cache_limit() // 2:
        # one text for every call, so Python shows it once per process
        warnings.warn(UncachedWeightsWarning(
            f"prepared weights over half the cache's cap ({format_bytes(cache_limit())}: BLOCKC_CACHE_MAX) "
            f"are made in memory on every run, not cached; a cap of twice their size keeps them"))
        return {name: make(name) for name in specs}
    identity = "" if sources is None else source_identity(sources)
    if identity is None:
        return None
    key = cache_key(identity, recipe, code_version())
    failed: list[BaseException] = []

    def made(name: str) -> np.ndarray:
        try:
            return make(name)
        except BaseException as e:
            failed.append(e)
            raise
    try:
        def write(tmp: Path) -> None:
            try:
                write_safetensors(tmp, specs, made)
            except WeightsError as e:   # a made array unlike its spec: the caller's mistake
                failed.append(e)
                raise
            if sources is not None and source_identity(sources) != identity:   # git re-stats after hashing too
                raise _SourcesChanged(f"the sources of {key} changed while it was made")
        return cached_entry(KIND, key, FILE, write, lambda entry: _views(entry, specs), verify="stat")
    except _SpecMismatch:   # made arrays that do not fit their specs: the caller's mistake
        raise
    except (OSError, BlockcError):   # the cache's folder, lock or file (its header unreadable: a WeightsError)
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
        raise _SpecMismatch(f"{entry}: the prepared weights do not match what was asked for "
                           f"({', '.join(printable(str(w)) for w in wrong)})")
    keep_with_maps(arrays.values(), use)
    files.close()
    return arrays
