"""Parameter counts of a model: per top-level module, per module type, and
against the rule of thumb ``N ≈ 12·L·d²`` for the non-embedding parameters.

Where the 12 comes from: a block with ``d_ff = 4d`` has ``4d²`` in the
attention projections (q, k, v, o) and ``8d²`` in the feed-forward pair,
ignoring biases and norms (Kaplan et al. 2020, "Scaling Laws for Neural
Language Models", table 1).

Tied weights count once: ``named_parameters()`` yields each ``Parameter``
object once, and a tied head (``x @ tok.weight.T``) declares no parameter.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import printable
from .layers import Embedding, LearnedPositionEmbedding
from .module import Model, Module, ModuleList
from .rotary import RotaryEmbedding

# Modules whose parameters are lookup tables rather than computation.
EMBEDDING_TYPES = (Embedding, LearnedPositionEmbedding, RotaryEmbedding)


@dataclass
class ModuleCount:
    """One row: a top-level module (or ``(own)`` for the model's own parameters)."""

    name: str
    kind: str
    params: int


@dataclass
class Summary:
    """Parameter counts of one model; ``format()`` renders them as a table."""

    model: str
    kind: str
    total: int
    embedding: int
    non_embedding: int
    modules: list[ModuleCount] = field(default_factory=list)
    by_type: dict[str, int] = field(default_factory=dict)
    layers: int | None = None
    d_model: int | None = None

    @property
    def estimate(self) -> int | None:
        """``12·L·d²`` when the model has ``cfg.layers`` and ``cfg.d_model``."""
        if self.layers is None or self.d_model is None:
            return None
        return 12 * self.layers * self.d_model ** 2

    @property
    def estimate_error(self) -> float | None:
        """``non_embedding / (12·L·d²) - 1``, e.g. ``0.0014`` for +0.14%."""
        est = self.estimate
        return None if not est else self.non_embedding / est - 1.0

    def rows(self) -> list[tuple[str, str, str, str]]:
        """The table's body as text cells: (module, type, parameters, share)."""
        out = [(m.name, m.kind, f"{m.params:,}", _share(m.params, self.total)) for m in self.modules]
        out.append(("total", "", f"{self.total:,}", _share(self.total, self.total)))
        return out

    def format(self) -> str:
        """A plain-text report: top-level modules, module types, embedding
        split and the ``12·L·d²`` comparison."""
        lines = [f"{printable(self.model)} ({self.kind}): {self.total:,} parameters ({_human(self.total)})", ""]
        lines += _table(("module", "type", "parameters", "share"), self.rows())
        lines.append("")
        type_rows = [(k, f"{v:,}", _share(v, self.total)) for k, v in
                     sorted(self.by_type.items(), key=lambda kv: -kv[1])]
        lines += _table(("module type", "parameters", "share"), type_rows)
        lines.append("")
        lines.append(f"embedding      {self.embedding:>15,}  {_share(self.embedding, self.total)}")
        lines.append(f"non-embedding  {self.non_embedding:>15,}  {_share(self.non_embedding, self.total)}")
        est = self.estimate
        if est is not None:
            lines.append(f"12·L·d²        {est:>15,}  (L={self.layers}, d={self.d_model}; "
                         f"non-embedding is {self.estimate_error:+.2%} of it)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()

    def to_rich(self):
        """The top-level table as a ``rich.table.Table`` (for terminals)."""
        from rich.table import Table

        table = Table(title=f"{self.model}: {self.total:,} parameters")
        for col, justify in (("module", "left"), ("type", "left"), ("parameters", "right"), ("share", "right")):
            table.add_column(col, justify=justify)
        for row in self.rows():
            table.add_row(*row)
        return table


def summarize(model: Module) -> Summary:
    """Count ``model``'s parameters; see ``Summary``."""
    seen: set[int] = set()
    by_type: dict[str, int] = {}
    embedding = 0
    # named_modules and named_parameters walk in the same order, so the first
    # module that owns a shared Parameter is the one that counts it.
    for _, m in model.named_modules():
        for p in m._params.values():
            if id(p) in seen:
                continue
            seen.add(id(p))
            kind = type(m).__name__
            by_type[kind] = by_type.get(kind, 0) + p.numel
            if isinstance(m, EMBEDDING_TYPES):
                embedding += p.numel
    tables = model.lookup_tables() if isinstance(model, Model) else set()
    embedding += sum(p.numel for n, p in model.named_parameters() if n in tables)
    total = sum(p.numel for _, p in model.named_parameters())
    modules = []
    own = sum(p.numel for p in model._params.values())
    if own:
        modules.append(ModuleCount("(own)", type(model).__name__, own))
    counted = {id(p) for p in model._params.values()}
    for name, sub in model._modules.items():
        n = 0
        for _, p in sub.named_parameters():
            if id(p) not in counted:
                counted.add(id(p))
                n += p.numel
        modules.append(ModuleCount(name, _describe(sub), n))
    cfg = getattr(model, "cfg", None)
    layers, d_model = getattr(cfg, "layers", None), getattr(cfg, "d_model", None)
    return Summary(model=getattr(model, "name", type(model).__name__), kind=type(model).__name__, total=total,
                   embedding=embedding, non_embedding=total - embedding, modules=modules, by_type=by_type,
                   layers=layers, d_model=d_model)


def _describe(m: Module) -> str:
    if isinstance(m, ModuleList):
        kinds = sorted({type(x).__name__ for x in m})
        return f"{len(m)} × {' / '.join(kinds)}" if kinds else "ModuleList (empty)"
    return type(m).__name__


def _share(n: int, total: int) -> str:
    return f"{100.0 * n / total:.1f}%" if total else "-"


def _human(n: int) -> str:
    for unit, size in (("B", 10 ** 9), ("M", 10 ** 6), ("K", 10 ** 3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """Aligned columns: text left, numbers (the last two) right."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    numeric = set(range(len(header) - 2, len(header)))

    def line(cells):
        return "  ".join(c.rjust(w) if i in numeric else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)]
