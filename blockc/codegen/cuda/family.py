"""The registry of the CUDA backend's kernel families.

A kernel family is declared once, beside its module in ``kernels/``, as a
``KernelFamily``: its emitter, the scratch its launch needs, its title in
the ``blockc cuda`` summary and whether that counts its kernels as fused
(held to never spill), the dtypes it generates, and its entry for each op
it computes where the op's kernel differs by more than its attributes (a
residual or not, which copy). An op names its family in its declaration
(``define(..., cuda="row_norm")``); the lowering, the memory plan and the
summary look the family up here. Importing ``codegen.cuda.kernels`` fills
the table, as importing ``blockc.ops`` fills the op registry.

    from ..family import KernelFamily, KernelStep, register
    from ..dtypes import FLOATS

    def emit_softplus(step: KernelStep) -> list[KernelCode]: ...

    SOFTPLUS = register(KernelFamily("softplus", "softplus", emit_softplus, FLOATS))
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ...ir.graph import Node
from ...ir.opdef import OpDef, get
from ...ir.types import TensorType
from .dtypes import ALL
from .kernel import KernelCode, LowerContext

KERNEL, ALIAS, INLINE = "kernel", "alias", "inline"


@dataclass(frozen=True)
class KernelStep:
    """What an emitter is given: the nodes of one launch step (a GEMM and
    the epilogue it absorbs, a chain of elementwise nodes, or one node), where
    their values live, the IR labels the kernel's comment names, and the
    build's GEMM choice (``kernels.gemm.GemmChoice``)."""

    nodes: list
    ctx: LowerContext
    labels: list
    gemm: Any = None

    @property
    def node(self) -> Node:
        """The step's last node: the one node of a single-node step."""
        return self.nodes[-1]


@dataclass(frozen=True, eq=False)
class KernelFamily:
    """One kind of CUDA kernel and everything the backend knows about it."""

    name: str                      # what an op's ``cuda`` names
    title: str                     # how the ``blockc cuda`` summary names its kernels
    emit: Callable[[KernelStep], list[KernelCode]] | None = None   # None: no kernel of its own
    dtypes: frozenset = ALL        # the output dtypes it generates
    fused: bool = False            # the summary's fused kernels, held to never spill
    scratch: Callable[[Node], TensorType | None] | None = None     # arena scratch its launch needs, or None
    entries: Mapping[str, Any] | None = None   # its entry for each op it computes; None: any op naming it
    placement: str = KERNEL        # ALIAS: a value is its input's buffer; INLINE: written into its readers

    def entry(self, op: str) -> Any:
        """What this family declares for ``op`` (a ``RowNorm``, a copy's emitter, ...)."""
        return self.entries[op]


FAMILIES: dict[str, KernelFamily] = {}


def register(family: KernelFamily) -> KernelFamily:
    if family.name in FAMILIES:
        raise AssertionError(f"CUDA kernel family {family.name} declared twice")
    FAMILIES[family.name] = family
    return family


def family_of(op: str) -> KernelFamily | None:
    """The kernel family that computes ``op`` (its declaration's ``cuda``),
    or None: the CUDA backend legalizes it by decomposition."""
    name = get(op).cuda
    if name is None:
        return None
    family = FAMILIES.get(name)
    if family is None:
        raise AssertionError(f"op {op}: unknown CUDA kernel family {name!r} (families: {', '.join(FAMILIES)})")
    if family.entries is not None and op not in family.entries:
        raise AssertionError(f"op {op}: the CUDA kernel family {name} has no entry for it "
                             f"(it computes {', '.join(family.entries)})")
    return family


def lowers(opdef: OpDef) -> bool:
    """Whether the CUDA backend has a kernel for ``opdef`` (else it is legalized by decomposition)."""
    return family_of(opdef.name) is not None
