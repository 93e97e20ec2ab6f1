"""The op registry and every op declaration (importing this package registers them)."""
from . import registry  # noqa: F401
from . import elementwise, fused, fused_onnx, nn, reduce, tensor  # noqa: F401  (registration side effects)
from .registry import OPS, OpDef, get  # noqa: F401
