"""Files that survive a second run and a crash.

* ``atomic_write``: one file, written under a temporary name in the target's
  folder and renamed into place when complete, with the permissions an
  ordinary new file gets (``mkstemp`` makes 0600). Every file blockc writes
  for a user goes through it, or through ``replace_together`` for files that
  belong together (an ONNX model and its external data).
* Both write where a path leads (``output_target``): a symlink is followed,
  and its target replaced, never the link; and only a regular file (or none)
  is replaced by renaming. A device or a FIFO (``--save /dev/null``) is
  written through (``writes_through``): a rename would swap ``/dev/null``
  for a regular file.
* Temporary names carry the writer's process id (``.NAME.PID.XXXX.tmp``), so
  the next writer of the same target removes what a killed run left
  (``remove_stale_partials``) without touching a live writer's files.
* ``cache_root``: the one cache folder (``$BLOCKC_CACHE``, else
  ``$XDG_CACHE_HOME/blockc``, else ``~/.cache/blockc``); ``cached_file``
  builds an entry in it under a lock, renames it into place when complete,
  records its size and SHA-256 beside it (or, for a large entry, what
  ``stat`` says of it), and rebuilds an entry that no longer matches (a
  truncated or corrupted file). The cache holds at most ``cache_limit()``
  (10 GiB, or ``$BLOCKC_CACHE_MAX``): after each build the least recently
  used entries are removed (``prune_cache``);
  ``cache_entries`` lists them (``blockc cache``). ``cached_value`` keeps
  any made bytes so (the compile cache: an optimized graph, a weightless
  ONNX export), under a ``cache_key`` of what they were made from;
  ``cached_entry`` any made file (prepared weights, checked by ``stat``).
* ``output_folder``: a folder of outputs (a CUDA build, a report) filled
  under a temporary name and renamed into place when complete, so an error
  or Ctrl-C leaves no folder and no partial file.
* ``check_writable`` and ``check_writable_dir``: whether a file, or a folder
  to fill, can be written, asked before any work so that a bad output path
  costs nothing; every command and report that writes asks these.
* ``format_bytes``: a size in bytes as people read it (``22.3 GiB``), the one
  spelling every message and report uses.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterator, NamedTuple, Sequence, TypeVar

from .environment import env_setting
from .errors import BlockcError

T = TypeVar("T")


_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def format_bytes(n: float) -> str:
    """``n`` bytes in binary units, to three significant digits: ``512 B``,
    ``1.5 KiB``, ``22.3 GiB``, ``8 GiB``, ``1000 KiB``."""
    for unit in _UNITS:
        if abs(n) < 1024 or unit == _UNITS[-1]:
            break
        n /= 1024
    if unit == "B":
        return f"{n:.0f} B"
    # .3g would write what rounds to 1000..1023 as "1e+03"
    return f"{n:.3g} {unit}" if abs(n) < 999.5 else f"{n:.0f} {unit}"


_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str, what: str) -> int:
    """``8G``, ``512M``, ``1.5GiB``, ``2000000000`` -> bytes; ``what`` names
    the option or variable in the error."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m or float(m.group(1)) <= 0:
        raise BlockcError(f"{what} {text!r}: expected a positive size, e.g. 8G, 512M or 2000000000")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).upper()])


def user_mode(executable: bool = False) -> int:
    """The mode a new file gets under the process's umask (0644 under 022;
    0755 for an ``executable`` one)."""
    return (0o777 if executable else 0o666) & ~_umask()


def _umask() -> int:
    try:  # Linux: read it without changing it (os.umask can only set it, racing other threads)
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def output_target(path: str | os.PathLike) -> str:
    """Where writing ``path`` lands, absolute: the file a symlink leads to
    (which is what gets written or replaced; the link stays a link)."""
    return os.path.realpath(os.fspath(path))


def writes_through(target: str) -> bool:
    """Whether writing ``target`` (an ``output_target``) goes into what is
    there rather than replacing it: a device, a FIFO, a socket. Neither a
    regular file nor a folder, nor missing."""
    try:
        mode = os.stat(target).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


# Linux's <fcntl.h>: start writing the dirty pages of the range, normally waiting for none (a full device
# queue can block it)
SYNC_FILE_RANGE_WRITE = 2


@functools.cache
def _sync_file_range():
    """libc's ``sync_file_range`` (Linux only), or None."""
    try:
        call = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):
        return None
    call.argtypes, call.restype = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint], ctypes.c_int
    return call


def start_writeback(f: IO, start: int, length: int) -> None:
    """Have the OS start writing bytes ``[start, start + length)`` of the
    file open as ``f`` to its disk now, normally without waiting for them
    (a full device queue can make it block). A file written a part at a
    time (``weights.write_safetensors``) is on disk as it is written, while
    the next part is made, so the ``fsync`` that must come
    before its rename (``atomic_write``, ``cached_entry``: a crash never
    leaves a whole-looking entry that is not) waits for little (a 384 MB
    file: 0.2 s of ``fsync`` to 0.01 s, measured). A hint alone: nothing
    where the OS has no such call, and its errors are the ``fsync``'s to raise."""
    f.flush()
    call = _sync_file_range()
    if call is not None:
        call(f.fileno(), start, length, SYNC_FILE_RANGE_WRITE)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """A file object open on a temporary name beside ``path``; on a clean
    exit it is synced and renamed over ``path``, on any error removed (the
    old ``path``, if any, untouched). A symlink's target is what is written
    and a device or FIFO is written through (``output_target``,
    ``writes_through``). An ``OSError`` becomes a ``BlockcError`` naming ``path``."""
    shown, path = os.fspath(path), output_target(path)
    if writes_through(path):
        with _opened(path, mode, shown) as f:
            yield f
        return
    directory = os.path.dirname(path)
    remove_stale_partials(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=partial_prefix(path), suffix=".tmp")
    except OSError as e:
        raise BlockcError(f"cannot write {shown}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, user_mode())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise BlockcError(f"cannot write {shown}: {e.strerror or e}") from None
        raise


@contextlib.contextmanager
def _opened(target: str, mode: str, shown: str) -> Iterator[IO]:
    """``target`` itself open for writing (a device, a FIFO): an ``OSError``
    becomes a ``BlockcError`` naming ``shown``."""
    try:
        with open(target, mode) as f:
            yield f
    except OSError as e:
        raise BlockcError(f"cannot write {shown}: {e.strerror or e}") from None


# -- can it be written --------------------------------------------------------
def check_writable(path: str | os.PathLike) -> None:
    """Refuse now, before any work, a file that cannot be written: a folder
    in its place, a folder to hold it that is missing (or is a file), or one
    that is not writable; for a device or FIFO (written through), the thing
    itself not writable. A symlink is asked about where it leads."""
    path, target = os.fspath(path), output_target(path)
    if os.path.isdir(target):
        raise BlockcError(f"cannot write {path}: it is a folder")
    if writes_through(target):
        if not os.access(target, os.W_OK):
            raise BlockcError(f"cannot write {path}: it is not writable")
        return
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):
        existing = _nearest_existing(directory)
        raise BlockcError(f"cannot write {path}: " + (f"{existing} is a file, not a folder" if os.path.exists(existing)
                                                      and not os.path.isdir(existing)
                                                      else f"the folder {directory} does not exist"))
    if not os.access(directory, os.W_OK):
        raise BlockcError(f"cannot write {path}: the folder {directory} is not writable")


def check_writable_dir(path: str | os.PathLike, what: str, flag: str) -> None:
    """Refuse now a folder that cannot be made or written into: a file already
    there, a file where a parent folder should be, or a folder that is not
    writable (the nearest one that exists, which will hold it). ``what`` and
    ``flag`` are for the message: ``cannot write {what} {path}: ...``, and the
    option that named the folder."""
    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise BlockcError(f"cannot write {what} {path}: it is a file, not a folder "
                          f"(give a new or existing folder with {flag})")
    existing = _nearest_existing(path)
    if not os.path.isdir(existing):
        raise BlockcError(f"cannot write {what} {path}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK):
        raise BlockcError(f"cannot write {what} {path}: the folder {existing} is not writable")


def _nearest_existing(path: str) -> str:
    """``path`` or its nearest ancestor that exists, absolute."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    return path


# -- partial files ------------------------------------------------------------
def partial_prefix(path: str | os.PathLike) -> str:
    """The start of a temporary name for ``path`` made by this process:
    ``.NAME.PID.`` (hidden, and telling which process owns it)."""
    return f".{os.path.basename(os.fspath(path))}.{os.getpid()}."


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def remove_stale_partials(path: str | os.PathLike) -> list[str]:
    """Remove the temporary files and folders that a killed writer of ``path``
    left beside it (``.NAME.PID.*.tmp`` whose process is gone); return them.
    A live writer's files, and anything else, are left alone."""
    path = os.path.abspath(os.fspath(path))
    folder, name = os.path.split(path)
    pattern = re.compile(r"\." + re.escape(name) + r"\.(\d+)\..*\.tmp\Z", re.S)
    removed = []
    try:
        entries = os.listdir(folder)
    except OSError:
        return removed
    for entry in entries:
        m = pattern.match(entry)
        if not m or int(m.group(1)) == os.getpid() or _alive(int(m.group(1))):
            continue
        full = os.path.join(folder, entry)
        with contextlib.suppress(OSError):
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            else:
                os.unlink(full)
            removed.append(full)
    return removed


@contextlib.contextmanager
def replace_together(paths: Sequence[str | os.PathLike]) -> Iterator[list[str]]:
    """Write several files that belong together (an ONNX model and its data).

    Yields one temporary path per target, with the target's own name, in a
    hidden folder beside the first target (so files that name each other,
    like a model and its external data, stay consistent). On a clean exit
    every target is replaced, in order, the first last: the others first, by
    the file written for them, or removed when none was (so a stale file never
    pairs with the new ones); the previous targets are moved aside first, so
    no reader sees an old file beside a new one, and restored if a rename
    fails. On any error nothing at the targets changes. Stale temporary
    folders from a killed run are removed first. Files get ``user_mode``.

    Targets are where their paths lead (``output_target``: a symlink's
    target, in one folder after that); a device or FIFO among them is
    written through with what was written for it, never moved or removed
    (``writes_through``), and the staging folder is the system's temporary
    one where its folder cannot be written (``/dev``)."""
    targets = [output_target(p) for p in paths]
    folder = os.path.dirname(targets[0])
    if any(os.path.dirname(t) != folder for t in targets):
        raise ValueError("replace_together: every target must be in one folder")
    if len({os.path.basename(t) for t in targets}) != len(targets):
        raise ValueError("replace_together: two targets have the same name")
    remove_stale_partials(targets[0])
    try:
        staging = tempfile.mkdtemp(dir=folder if os.access(folder, os.W_OK) else None,
                                   prefix=partial_prefix(targets[0]), suffix=".tmp")
    except OSError as e:
        raise BlockcError(f"cannot write {targets[0]}: {e.strerror or e}") from None
    try:
        staged = [os.path.join(staging, os.path.basename(t)) for t in targets]
        yield staged
        for s in staged:
            if os.path.exists(s):   # an executable one (a build.sh) stays executable
                os.chmod(s, user_mode(executable=bool(os.stat(s).st_mode & 0o100)))
        _place(targets, staged, staging)
    except OSError as e:
        raise BlockcError(f"cannot write {targets[0]}: {e.strerror or e}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _place(targets: list[str], staged: list[str], staging: str) -> None:
    """``replace_together``'s last step: each staged file onto its target,
    the first last; the old ones aside first and back if a rename fails."""
    through = {t for t in targets if writes_through(t)}
    aside: list[tuple[str, str]] = []
    placed: list[str] = []
    try:
        for i, t in enumerate(targets):
            if os.path.lexists(t) and t not in through:
                old = os.path.join(staging, f".old.{i}")
                os.replace(t, old)
                aside.append((old, t))
        for t in targets[::-1]:   # the first target (the model) goes aside first and comes back last
            s = staged[targets.index(t)]
            if not os.path.exists(s):
                continue
            if t in through:
                with open(s, "rb") as src, open(t, "wb") as dst:
                    shutil.copyfileobj(src, dst)
            else:
                os.replace(s, t)
                placed.append(t)
    except OSError:
        for t in placed:
            with contextlib.suppress(OSError):
                os.unlink(t)
        for old, t in aside:
            with contextlib.suppress(OSError):
                os.replace(old, t)
        raise


def _make_parents(folder: str) -> list[str]:
    """Make ``folder`` and its missing parents; the ones made, outermost first."""
    missing = []
    while not os.path.isdir(folder) and folder != os.path.dirname(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    for d in reversed(missing):
        os.mkdir(d)
    return missing[::-1]


@contextlib.contextmanager
def output_folder(path: str | os.PathLike, *, last: str | None = None) -> Iterator[Path]:
    """A folder of outputs that appears complete or not at all (a build, a
    report). Yields a hidden temporary folder beside ``path`` to fill. On a
    clean exit a new ``path`` is that folder renamed; an existing one gets
    the files through ``replace_together``, ``last`` placed last, and keeps
    its other files. On any error or interrupt (Ctrl-C) the temporary folder
    and the parent folders made for it are removed: nothing is left."""
    target = os.path.abspath(os.fspath(path))
    made: list[str] = []
    try:
        made = _make_parents(os.path.dirname(target))
        remove_stale_partials(target)
        staging = tempfile.mkdtemp(dir=os.path.dirname(target), prefix=partial_prefix(target), suffix=".tmp")
    except OSError as e:
        _remove_folders(made)
        raise BlockcError(f"cannot write {target}: {e.strerror or e}") from None
    done = False
    try:
        yield Path(staging)
        os.chmod(staging, user_mode(executable=True))
        if not os.path.lexists(target):
            os.rename(staging, target)
        else:
            names = sorted(os.listdir(staging), key=lambda name: name != last)
            for name in names:   # what a killed writer of any of them left in the folder
                remove_stale_partials(os.path.join(target, name))
            with replace_together([os.path.join(target, name) for name in names]) as staged:
                for name, tmp in zip(names, staged):
                    os.replace(os.path.join(staging, name), tmp)
        done = True
    except OSError as e:
        raise BlockcError(f"cannot write {target}: {e.strerror or e}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if not done:
            _remove_folders(made)


def _remove_folders(folders: list[str]) -> None:
    for d in reversed(folders):
        with contextlib.suppress(OSError):
            os.rmdir(d)


# -- the cache ------------------------------------------------------------------
class StatIdentity(NamedTuple):
    """What ``stat`` says of a file that a rewrite or a replacement changes:
    the one rule for "has this file changed" without reading it (a cache
    entry's record, a checkpoint's part of a prepared-weights key, an nvcc's
    cached answers). ctime is there because ``cp -p`` and ``rsync --inplace``
    keep size, inode and mtime but not ctime; what it cannot see (a
    filesystem without real ctimes or inodes) is said in docs/CACHE.md."""

    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int
    dev: int

    def without_ctime(self) -> dict[str, int]:
        """This identity less its ctime: for a file that is only ever replaced,
        never rewritten in place (a cache entry's own record). Its ctime would
        also change on a chmod, chown, new hard link or xattr, and call an
        unchanged file changed."""
        return {k: v for k, v in self._asdict().items() if k != "ctime_ns"}


RACY_NS = 2_000_000_000   # a file changed this recently may change again without its stat changing


def _now_ns() -> int:
    return time.time_ns()


def stat_identity(file: str | os.PathLike | os.stat_result) -> StatIdentity:
    """The ``StatIdentity`` of a path, or of an ``os.stat``/``os.fstat`` result."""
    st = file if isinstance(file, os.stat_result) else os.stat(file)
    return StatIdentity(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def same_file(read: os.stat_result, now: os.stat_result | None) -> bool:
    """Whether ``now`` (what a path's ``stat`` says now) is still the file
    ``read`` was taken of, whose bytes were read or mapped. Its ctime counts:
    a rewrite in place that keeps the size and the mtime (``cp -p``,
    ``rsync --inplace``) changes only the ctime, and so does a chmod, which
    cannot be told from it; refusing a chmod is the price of never reading
    a rewrite's bytes at the old file's offsets."""
    return now is not None and stat_identity(now) == stat_identity(read)


def racy(identity: StatIdentity) -> bool:
    """Whether the file changed within ``RACY_NS`` of now, either way (a clock
    set back counts too): git's rule for its index. A rewrite within the
    filesystem's timestamp tick could leave the same stat behind, so nothing
    made from a racy file may be kept under its stat."""
    now = _now_ns()
    return abs(now - identity.mtime_ns) < RACY_NS or abs(now - identity.ctime_ns) < RACY_NS


def cache_root() -> Path:
    """blockc's one cache folder: ``$BLOCKC_CACHE``, else ``$XDG_CACHE_HOME/blockc``,
    else ``~/.cache/blockc``. Created on first use; one that cannot be created is
    a ``BlockcError`` naming it and the variable to set."""
    root = os.environ.get("BLOCKC_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "blockc")
    try:
        os.makedirs(root, exist_ok=True)
    except OSError as e:
        raise BlockcError(f"cannot create the cache folder {root}: {e.strerror or e} "
                          "(set BLOCKC_CACHE to a writable folder)") from None
    return Path(root)


@contextlib.contextmanager
def file_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing, never
    removed: removing a lock file lets two processes lock different files)."""
    try:
        fd = os.open(os.fspath(path), os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        raise BlockcError(f"cannot lock {path}: {e.strerror or e}") from None
    try:
        _flock(fd, fcntl.LOCK_EX, path)
        yield
    finally:
        os.close(fd)  # releases the lock


# what flock(2) fails with where the filesystem cannot lock (NFS with no lock manager: ENOLCK; a filesystem
# without lock support: EOPNOTSUPP, ENOSYS, EINVAL); others (EBADF, ENOMEM, ...) say nothing of the filesystem
_NO_FLOCK = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL})


def _flock(fd: int, operation: int, path) -> None:
    """``fcntl.flock`` (flock(2) on Linux), a failure refused naming the
    file: a filesystem without working locks (NFS with no lock manager
    says "No locks available") cannot hold the cache (docs/CACHE.md), and
    the refusal says so only when the errno means that."""
    try:
        fcntl.flock(fd, operation)
    except OSError as e:
        hint = (" (its filesystem gives no working flock; set BLOCKC_CACHE to a folder on a local disk)"
                if e.errno in _NO_FLOCK else "")
        raise BlockcError(f"cannot lock {path}: {e.strerror or e}{hint}") from None


def _fingerprint(path: Path, verify: str = "sha256") -> dict:
    """What ``PATH.ok`` records of an entry: its size, and its SHA-256
    (``verify="sha256"``) or what ``stat`` says of the placed file
    (``verify="stat"``: its ``stat_identity`` less its ctime, which a
    replacement changes; no read of its bytes, for entries of gigabytes)."""
    st = path.stat()
    if verify == "stat":
        return stat_identity(st).without_ctime()
    if verify != "sha256":
        raise ValueError(f"verify must be 'sha256' or 'stat', not {verify!r}")
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return {"size": st.st_size, "sha256": h.hexdigest()}


def _intact(path: Path, stamp: Path, verify: str = "sha256") -> bool:
    try:
        recorded = json.loads(stamp.read_text())
        return path.stat().st_size == recorded["size"] and _fingerprint(path, verify) == recorded
    except (OSError, ValueError, KeyError, TypeError):
        return False


def cached_file(path: str | os.PathLike, make: Callable[[Path], None], verify: str = "sha256") -> Path:
    """``path``, a cache entry, made by ``make(tmp)`` unless it is there and intact.

    ``make`` writes the file at ``tmp`` (a temporary name beside ``path``).
    It runs under a lock on ``PATH.lock``, so concurrent first builds make it
    once and never see a partial file; the result is renamed into place and its
    size and SHA-256 recorded in ``PATH.ok``. An entry without that record or
    not matching it (a 0-byte file from a killed build, a truncated or changed
    one) is made again. ``verify="stat"`` records and checks the placed
    file's ``stat_identity`` less its ctime instead of its SHA-256
    (``_fingerprint``): for large entries (prepared weights) whose hashing
    would cost seconds on every use; such an entry is never written in
    place, only replaced. A rebuild removes only the record, never the file:
    a reader elsewhere finds the old file at the path until the new one
    replaces it."""
    return _cached_in_use(Path(path), make, verify, hold=False)[0]


def _cached_in_use(path: Path, make: Callable[[Path], None], verify: str,
                   hold: bool = True) -> tuple[Path, EntryUse | None]:
    """``cached_file``, with the entry in use (``EntryUse``, when ``hold``)
    from before its build lock is released and its prune runs: no prune of
    another process removes it before the caller reads it."""
    stamp = path.with_name(path.name + ".ok")
    if stamp.is_file():   # the one full check runs with the entry in use: a hit hashes it once
        with contextlib.suppress(OSError, BlockcError):   # pruned meanwhile: made again below
            use = EntryUse(path) if hold else None
            if _intact(path, stamp, verify):
                _used(stamp)
                return path, use
            if use:
                use.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(path.with_name(path.name + ".lock")):
        if not _intact(path, stamp, verify):
            _build(path, stamp, make, verify)
        use = EntryUse(path) if hold else None
    if path.resolve().is_relative_to(cache_root().resolve()):
        prune_cache(keep=path.parent)
    return path, use


def _build(path: Path, stamp: Path, make: Callable[[Path], None], verify: str) -> None:
    remove_stale_partials(path)
    # only the record: the old file stays at the path for readers in other processes
    # until os.replace swaps the new one in
    with contextlib.suppress(FileNotFoundError):
        stamp.unlink()
    tmp = path.with_name(f"{partial_prefix(path)}build.tmp")
    try:
        make(tmp)
        if not tmp.is_file() or tmp.stat().st_size == 0:
            raise BlockcError(f"building {path} made no file")
        os.chmod(tmp, user_mode())
        os.replace(tmp, path)
        record = _fingerprint(path, verify)   # once placed: a rename changes the ctime
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    with atomic_write(stamp, "w") as f:
        json.dump(record, f)


# What each kind of cached artifact did in this process: CACHE_COUNTS[kind, "hit" | "miss"] (tests and
# benches read it)
CACHE_COUNTS: Counter = Counter()


def cache_key(*parts: str | bytes) -> str:
    """16 hex digits of SHA-256 over ``parts``, each length-prefixed so no two
    lists of parts hash alike: the name of a cache entry made from them."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()[:16]


def cached_value(kind: str, key: str, name: str, make: Callable[[], bytes], read: Callable[[bytes], T]) -> T:
    """``read(make())``, with what ``make`` returned kept in the cache as
    ``KIND/KEY/NAME`` (``cached_entry``, which see)."""
    return cached_entry(kind, key, name, lambda tmp: tmp.write_bytes(make()), lambda entry: read(entry.read_bytes()))


def cached_entry(kind: str, key: str, name: str, write: Callable[[Path], None], read: Callable[[Path], T],
                 verify: str = "sha256") -> T:
    """``read(entry)`` of the cache entry ``KIND/KEY/NAME``, which ``write(tmp)``
    makes when it is missing or damaged (``cached_file``: built once under a
    lock, recorded, checked as ``verify`` says, rebuilt when damaged; pruned
    to ``cache_limit()`` with every other entry, listed and cleared by
    ``blockc cache``). An entry that is intact on disk but that ``read``
    refuses (written by a build that died between its record and its use,
    or tampered with) is made again. Counted in ``CACHE_COUNTS``."""
    path = cache_root() / kind / key / name
    for attempt in (0, 1):
        made = []

        def build(tmp: Path) -> None:
            made.append(True)
            write(tmp)
        entry, use = _cached_in_use(path, build, verify)
        try:
            value = read(entry)
        except Exception:
            use.close()
            if made or attempt:
                raise
            with contextlib.suppress(FileNotFoundError):   # the file itself stays until replaced
                entry.with_name(entry.name + ".ok").unlink()
            continue
        use.close()   # what read kept of the entry takes its own EntryUse (frontends/prepared.py)
        CACHE_COUNTS[kind, "miss" if made else "hit"] += 1
        return value
    raise AssertionError("unreachable")


def _used(stamp: Path) -> None:
    """An entry's last use is its record's time: least recently used goes first."""
    with contextlib.suppress(OSError):
        os.utime(stamp)


# -- the cache's size -----------------------------------------------------------
CACHE_LIMIT = 10 << 30   # the cache's default cap; $BLOCKC_CACHE_MAX sets another ("20G", "500M")


@dataclass(frozen=True)
class CacheEntry:
    """One built entry of the cache: its folder, its size in bytes and when
    it was last used (a time in seconds since the epoch)."""

    path: Path
    size: int
    used: float


def cache_limit() -> int:
    """The most the cache may hold: ``$BLOCKC_CACHE_MAX``, else ``CACHE_LIMIT``."""
    return env_setting("BLOCKC_CACHE_MAX", lambda text: parse_size(text, "BLOCKC_CACHE_MAX"), CACHE_LIMIT,
                       "a size")


def _folder_size(folder: Path) -> int:
    total = 0
    for base, _, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(base, name)).st_size
    return total


def cache_entries() -> list[CacheEntry]:
    """Every entry of the cache (a folder holding a recorded file, ``NAME.ok``),
    least recently used first."""
    folders: dict[Path, float] = {}
    for stamp in cache_root().rglob("*.ok"):
        with contextlib.suppress(OSError):
            folders[stamp.parent] = max(folders.get(stamp.parent, 0.0), stamp.stat().st_mtime)
    return sorted((CacheEntry(f, _folder_size(f), used) for f, used in folders.items()), key=lambda e: e.used)


class EntryUse:
    """A shared ``flock`` on a cache entry's ``NAME.use``, held until
    ``close()`` or until this object is garbage collected: while it is held,
    no ``prune_cache`` (of this process or another) removes the entry.
    ``cached_entry`` holds one from before the build lock is released until
    ``read`` returns; whoever reads an entry by its path later takes its own
    (``frontends/prepared.py``: ONNX Runtime opens prepared weights by path
    when each session is made) and keeps it as long as what it read."""

    def __init__(self, path: Path):
        use = path.with_name(path.name + ".use")
        self._fd: int | None = None
        self._fd = os.open(use, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            _flock(self._fd, fcntl.LOCK_SH, use)   # waits while a prune removes the entry
        except BlockcError:
            self.close()
            raise
        # a prune that removed the entry before we held the lock: our lock is on a removed file
        try:
            held = os.stat(use).st_ino == os.fstat(self._fd).st_ino and path.is_file()
        except OSError:
            held = False
        if not held:
            self.close()
            raise BlockcError(f"the cache entry {path} was removed while it was opened")

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)   # releases the lock
            self._fd = None

    __del__ = close


@contextlib.contextmanager
def _claimed(folder: Path) -> Iterator[bool]:
    """Whether no process builds or uses the entry ``folder`` (holds one of
    its ``*.lock`` or ``*.use`` files); when none does, the locks are held
    until the block ends, so no reader starts using the entry while it is removed.
    Each recorded file's ``NAME.lock`` and ``NAME.use`` are locked, made if
    missing, so an ``EntryUse`` taken meanwhile waits on the same file and
    then sees it removed; every ``.lock`` before any ``.use``, as a builder takes them."""
    names = {stamp.name[:-len(".ok")] for stamp in folder.glob("*.ok")}
    locks = sorted({*(folder / f"{n}.lock" for n in names), *folder.glob("*.lock")})
    uses = sorted({*(folder / f"{n}.use" for n in names), *folder.glob("*.use")})
    with contextlib.ExitStack() as held:
        for lock in [*locks, *uses]:
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError:
                continue
            held.callback(os.close, fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                yield False
                return
        yield True


def prune_cache(limit: int | None = None, *, keep: Path | None = None) -> list[CacheEntry]:
    """Remove the least recently used entries until the cache holds at most
    ``limit`` bytes (``cache_limit()``); never ``keep`` (the entry just made)
    nor one being built or in use (``EntryUse``). Returns the entries removed."""
    limit = cache_limit() if limit is None else limit
    entries = cache_entries()
    total = sum(e.size for e in entries)
    removed = []
    for entry in entries:
        if total <= limit:
            break
        if entry.path == keep:
            continue
        with _claimed(entry.path) as free:
            if not free:
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
        total -= entry.size
        removed.append(entry)
    return removed
