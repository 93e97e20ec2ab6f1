"""What a kernel emitter produces, and what it may ask of the code generator.

An emitter turns one IR node (or a fused group of elementwise nodes) into a
``KernelCode``: CUDA source holding the ``__global__`` kernel(s) and a
``static`` host launcher, plus the one C statement the model's run function
uses to call that launcher. Emitters name buffers and dims only through the
``LowerContext``, so they never see how memory is planned.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from ...errors import BlockcError
from ...ir.dims import Dim, Sym
from ...ir.dtypes import DType
from ...ir.graph import Node, Value
from .dtypes import CUDA_DTYPES, CudaDType
from .templates import render

# C++ and CUDA words a sanitised identifier must never be.
_RESERVED = set("""alignas alignof and and_eq asm auto bitand bitor bool break case catch char char16_t char32_t
class compl const constexpr const_cast continue decltype default delete do double dynamic_cast else enum explicit
export extern false float for friend goto if inline int long mutable namespace new noexcept not not_eq nullptr
operator or or_eq private protected public register reinterpret_cast return short signed sizeof static
static_assert static_cast struct switch template this thread_local throw true try typedef typeid typename union
unsigned using virtual void volatile wchar_t while xor xor_eq main threadIdx blockIdx blockDim gridDim warpSize
dim3 half float4 int4""".split())

class CudaCodegenError(BlockcError):
    """An op, dtype or shape the CUDA backend cannot generate."""


def c_identifier(label: str, prefix: str = "v") -> str:
    """A safe C identifier derived from any label (quotes, ``*/``, newlines,
    keywords): letters, digits and ``_`` only, never a keyword, with a short
    hash when anything had to be changed, so distinct labels stay distinct."""
    clean = re.sub(r"[^A-Za-z0-9_]", "_", label)[:48].strip("_") or prefix
    if clean[0].isdigit():
        clean = f"{prefix}_{clean}"
    if clean != label or clean in _RESERVED or clean.startswith("__"):
        digest = hashlib.sha1(label.encode()).hexdigest()[:6]
        clean = f"{prefix}_{clean.lstrip('_')}_{digest}"
    return clean


def c_comment(text: str) -> str:
    """Text safe inside a ``/* */`` or ``//`` comment: no terminators, one line."""
    return re.sub(r"[^ -~]", "?", text).replace("*/", "*?").replace("/*", "?*").replace("\\", "?")


def c_string(text: str) -> str:
    """A C string literal holding ``text`` made safe as ``c_comment`` makes it
    (so no label reaches the source raw), its quotes and question marks escaped.
    Pass it as a ``%s`` argument, never as a format: ``%`` is kept."""
    return '"' + c_comment(text).replace('"', '\\"').replace("?", "\\?") + '"'


def cuda_dtype(dtype: DType) -> CudaDType:
    try:
        return CUDA_DTYPES[dtype]
    except KeyError:
        raise CudaCodegenError(f"the CUDA backend has no type for {dtype.name}") from None


def ctype(dtype: DType) -> str:
    """The C type a buffer of ``dtype`` stores."""
    return cuda_dtype(dtype).storage


def suffix(dtype: DType) -> str:
    """``dtype``'s part of a kernel name (``f32``)."""
    return cuda_dtype(dtype).suffix


@dataclass
class KernelCode:
    """One launch step of the generated model, kept as what it is rendered
    from: a template and its parameters. Its name is given last (the
    lowering renames a kernel whose name another, rendered from different
    parameters, already has), so the source, the launch and the function
    names are all made from whatever name it has by then."""

    name: str                 # kernel name: op and shape class, e.g. add_layernorm_f32_768
    template: str             # the jinja template of its device code and static host launcher
    params: dict              # the template's parameters besides `name` and `nodes`
    launch: Callable[[str], str]   # name -> the C statement that launches it (uses `stream`)
    nodes: list = field(default_factory=list)   # IR node labels it computes
    ops: list = field(default_factory=list)     # their ops
    functions: tuple = ()     # its __global__ functions, as suffixes of its name ("" the name itself)
    family: Any = None        # the KernelFamily that emitted it (set by the lowering)

    @property
    def call(self) -> str:
        return self.launch(self.name)

    @property
    def kernels(self) -> list[str]:
        """The ``__global__`` function names in its source."""
        return [self.name + s for s in self.functions]

    @property
    def rendered_from(self) -> tuple:
        """What its source is made of, but for its name and node labels:
        two steps with equal ones share one kernel definition."""
        return (getattr(self.family, "name", None), self.template, self.params)

    def render(self, labels: list[str]) -> str:
        """Its source, the comment naming ``labels`` as the IR nodes it computes."""
        return render(self.template, name=self.name, nodes=nodes_comment(labels), **self.params)

    @property
    def source(self) -> str:
        return self.render(self.nodes)


def nodes_comment(labels: list[str], width: int = 110) -> str:
    """The text after ``// IR nodes: `` in a kernel's source: each label
    once, lines wrapped at ``width`` and continued as ``//   label ...``."""
    lines, line = [], "// IR nodes:"
    for w in dict.fromkeys(c_comment(lab) for lab in labels):
        if len(line) + len(w) > width:
            lines.append(line)
            line = "//  "
        line += " " + w
    lines.append(line)
    return "\n".join(lines)[len("// IR nodes: "):]


class LowerContext:
    """Names of buffers and dims in the generated run function."""

    def __init__(self, symbols: list[str]):
        self.symbols = list(symbols)
        self._ptrs: dict[int, str] = {}
        self._id_flags: dict[int, str] = {}
        self._views: dict = {}                 # id(value) -> views.View: where a kernel finds it
        self._scratch: dict[int, str] = {}     # id(node) -> its scratch buffer in the arena
        self.checked_ids: list = []            # slot k of the run function's id_errors: an input or a gather
        self.gemm_sites = 0                    # library GEMM call sites, each with its own plan in the model

    def gemm_site(self) -> int:
        """A new index into the model's per-site GEMM state (``kernels/gemm.py``)."""
        self.gemm_sites += 1
        return self.gemm_sites - 1

    def check_ids(self, key: Value | Node) -> None:
        """Kernels that index with ``key`` (an input with an id range,
        ``ops/limits.py``), or the gather ``key`` (indices the model computes,
        ``kernels/copy.own_indices``), record the first position of an id
        outside their table in its own slot of ``id_errors``, which
        ``blockc_run`` reads."""
        self._id_flags[id(key)] = f"(id_errors + {len(self.checked_ids)})"
        self.checked_ids.append(key)

    def id_flag(self, key: Value | Node) -> str | None:
        """Where a kernel indexing with the input ``key``, or the gather
        ``key``, records a bad id (an ``unsigned long long*``), or None when
        nobody reads it."""
        return self._id_flags.get(id(key))

    def set_views(self, views: dict) -> None:
        """Operands a kernel reads or writes through strides in another
        value's buffer (``views.fold_attention_views``)."""
        self._views = dict(views)

    def view(self, value: Value):
        """The ``views.View`` a kernel reads ``value`` through, or None (its own buffer, contiguous)."""
        return self._views.get(id(value))

    def bind_scratch(self, node: Node, expr: str) -> None:
        self._scratch[id(node)] = expr

    def scratch(self, node: Node) -> str | None:
        """A ``float*`` C expression for the arena scratch ``node``'s kernel
        asked for (its family's ``scratch``), or None where it has none."""
        expr = self._scratch.get(id(node))
        return None if expr is None else f"((float*){expr})"

    def bind(self, value: Value, expr: str) -> None:
        self._ptrs[id(value)] = expr

    def alias(self, value: Value, target: Value) -> None:
        """``value`` (a reshape's result) shares ``target``'s buffer."""
        if id(target) in self._ptrs:
            self._ptrs[id(value)] = self._ptrs[id(target)]

    def ptr(self, value: Value) -> str:
        """A C expression of type ``T*`` for ``value``'s buffer."""
        try:
            return f"(({ctype(value.dtype)}*){self._ptrs[id(value)]})"
        except KeyError:
            raise CudaCodegenError(f"no buffer for {value!r}") from None

    def dim(self, d: Dim) -> str:
        """A C ``long long`` expression for a dim; symbols are run-time variables."""
        if isinstance(d, int):
            return f"{d}LL"
        parts = []
        for mono, coeff in d.terms.items():
            factors = [f"{coeff}LL"] + [f"dim_{s}" for s in mono]
            parts.append("*".join(factors))
        return "(" + " + ".join(parts) + ")"

    def numel(self, shape) -> str:
        return "*".join(self.dim(d) for d in shape) if shape else "1LL"


def index_lines(shape, ctx: "LowerContext", used: str) -> list[str]:
    """Decompose the linear index ``rest`` into the multi-index axes that
    ``used`` (the code that will read them) mentions; others are skipped."""
    axes = [a for a in range(len(shape)) if re.search(rf"\bidx{a}\b", used)]
    lines = []
    for a in range(len(shape) - 1, min(axes, default=len(shape)) - 1, -1):
        d = ctx.dim(shape[a])
        lines.append(f"const long long idx{a} = rest % {d}; rest /= {d};" if a in axes else f"rest /= {d};")
    if lines and lines[-1].startswith("rest /="):
        lines.pop()
    return lines


def static_int(d: Dim) -> int | None:
    return d if isinstance(d, int) else None


def shape_class(shape) -> str:
    """A kernel-name suffix naming what is static about a shape: ``768``, ``n``."""
    last = shape[-1] if shape else 1
    return str(last) if isinstance(last, int) else "n"


def is_symbolic(d: Dim) -> bool:
    return isinstance(d, Sym)
