"""Writing a file so that a reader never sees half of it: the bytes go to a
temporary name in the target's folder and are renamed into place when
complete, with the permissions an ordinary new file gets (``mkstemp`` makes
0600). Every file blockc writes for a user goes through ``atomic_write``."""
from __future__ import annotations

import contextlib
import os
import tempfile
from typing import IO, Iterator

from .errors import BlockcError


def user_mode() -> int:
    """The mode a new file gets under the process's umask (0644 under 022)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """A file object open on a temporary name beside ``path``; on a clean
    exit it is synced and renamed over ``path``, on any error removed (the
    old ``path``, if any, untouched). An ``OSError`` becomes a ``BlockcError``
    naming ``path``."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    except OSError as e:
        raise BlockcError(f"cannot write {path}: {e.strerror or e}") from None
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
            raise BlockcError(f"cannot write {path}: {e.strerror or e}") from None
        raise
