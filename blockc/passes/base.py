"""What every pass returns."""
from __future__ import annotations

from dataclasses import dataclass

from ..ir.graph import Graph


@dataclass
class PassResult:
    """The graph after the pass, and whether the pass changed anything."""

    graph: Graph
    changed: bool
