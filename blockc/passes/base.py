"""What every pass returns."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.graph import Graph


@dataclass
class PassResult:
    """The graph after the pass, whether the pass changed anything, and the
    sites it looked at (``rewrite.Site``: what a rule matched or why not;
    empty for a pass that matches no patterns).

    A pass never changes its input: it returns a changed copy, or, having
    found nothing to do, the input itself (copying a deep graph only to hand
    it back unchanged is most of such a pass's cost)."""

    graph: Graph
    changed: bool
    sites: list = field(default_factory=list)
