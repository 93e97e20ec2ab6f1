"""blockc's version: at the bottom of the package, where every layer may read it."""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

__version__ = "0.1.0"


@functools.lru_cache(maxsize=None)
def code_version() -> str:
    """``__version__`` and a digest of the package's own files (its Python,
    templates and tables): what a compile cache key names, so that an entry
    made by other code -- another release, or an edited checkout whose
    version string did not change -- is never read back."""
    root = Path(__file__).parent
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".j2", ".json", ".h", ".cu", ".cuh")):
        for part in (path.relative_to(root).as_posix().encode(), path.read_bytes()):
            h.update(len(part).to_bytes(8, "little") + part)
    return f"{__version__}+{h.hexdigest()[:16]}"
