"""The op registry, as the op declarations use it. The table itself lives in
``blockc/ir/opdef.py`` (a graph needs it to type the nodes it makes)."""
from ..ir.opdef import (BOOL, DIM, DIMS, FLOAT, INT, OPS, REQUIRED, STR, TENSOR,  # noqa: F401
                        NotApplicable, OpDef, attr_symbols, collective_ops, define, fused_ops, get)
