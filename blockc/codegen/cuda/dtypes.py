"""The CUDA backend's one dtype table: for each IR ``DType`` it generates,
the C type a buffer stores, the type its elements are computed in, the
kernel-name suffix and the ``cudaDataType`` cuBLASLt is given (floats only).
A dtype absent here (float64) is refused before anything is rendered; each
kernel family declares which of these it generates (``family.KernelFamily``)."""
from __future__ import annotations

from dataclasses import dataclass

from ...ir.dtypes import DType


@dataclass(frozen=True)
class CudaDType:
    dtype: DType
    storage: str                 # the C type of a buffer's element
    compute: str                 # the C type arithmetic is done in (loads widen, stores narrow)
    library: str | None = None   # cuBLASLt's cudaDataType for it

    @property
    def suffix(self) -> str:
        """Its part of a kernel's name: the IR's short spelling (``f16``), but ``b8`` for bool."""
        return "b8" if self.dtype == DType.bool else self.dtype.short


CUDA_DTYPES: dict[DType, CudaDType] = {t.dtype: t for t in (
    CudaDType(DType.float32, "float", "float", "CUDA_R_32F"),
    CudaDType(DType.float16, "__half", "float", "CUDA_R_16F"),
    CudaDType(DType.bfloat16, "__nv_bfloat16", "float", "CUDA_R_16BF"),
    CudaDType(DType.int64, "long long", "long long"),
    CudaDType(DType.int32, "int", "long long"),
    CudaDType(DType.bool, "bool", "bool"),
)}

ALL = frozenset(CUDA_DTYPES)
FLOATS = frozenset(d for d in CUDA_DTYPES if d.is_float)


def spelled(dtypes) -> str:
    """``float32, float16 and bfloat16``: a set of dtypes in the table's order, for an error."""
    names = [d.name for d in CUDA_DTYPES if d in dtypes]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
