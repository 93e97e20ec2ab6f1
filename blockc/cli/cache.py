"""``blockc cache``: list or clear the build cache."""
from __future__ import annotations

import time

NAME = "cache"
HELP = "list or clear the build cache"
DESCRIPTION = ("List the build cache's entries (size, last use), most recent first, and its total against its cap "
               "(BLOCKC_CACHE_MAX, default 10G; the least recently used entries go after each build once the cache "
               "is over it). --clear removes every entry.")


def add_arguments(p) -> None:
    p.add_argument("--clear", action="store_true", help="remove every entry (those being built or in use are left)")


def run(args) -> int:
    from ..files import cache_entries, cache_limit, cache_root, format_bytes, prune_cache
    root = cache_root()
    if args.clear:
        removed = prune_cache(0)
        print(f"removed {len(removed)} entries ({format_bytes(sum(e.size for e in removed))}) from {root}")
        return 0
    entries = cache_entries()
    for e in reversed(entries):   # the most recently used first
        print(f"{format_bytes(e.size):>10}  {time.strftime('%Y-%m-%d %H:%M', time.localtime(e.used))}  "
              f"{e.path.relative_to(root)}")
    print(f"{root}: {len(entries)} entries, {format_bytes(sum(e.size for e in entries))} "
          f"(at most {format_bytes(cache_limit())}: BLOCKC_CACHE_MAX)")
    return 0
