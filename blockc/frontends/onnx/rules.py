"""The importer's one table: for each ONNX domain, op type -> ``convert.Rule``.

The rules live in modules by op group, each with a ``RULES`` dict, and are
assembled here, above all of them, so that no rule module imports another's
table (the opset-23 module once completed ``convert.py``'s table from the
bottom of that file, an import cycle):

* ``convert_math.py``, ``convert_shape.py``, ``convert_nn.py``: the ai.onnx
  operators, by group (arithmetic and reductions; shapes, indexing and
  constants; softmax, the norms, Gelu, Dropout), written with the helpers of
  ``convert.py``, which every group uses;
* ``opset23.py``: the opset-23 fused operators (Attention, RMSNormalization,
  RotaryEmbedding), ai.onnx too;
* ``contrib.py``: ONNX Runtime's ``com.microsoft`` fused operators, whose op
  types overlap ai.onnx's (Attention, RotaryEmbedding): hence one table per
  domain; and the ops ONNX Runtime registers in the ONNX domain itself
  (``ONNX_DOMAIN_RULES``: SimplifiedLayerNormalization, as GenAI's model
  builder writes it).
"""
from __future__ import annotations

from . import contrib, convert_math, convert_nn, convert_shape, opset23
from .convert import Rule
from .functions import DEFAULT_DOMAINS

# ai.onnx, under each of its names (functions.DEFAULT_DOMAINS)
TABLE: dict[str, Rule] = {**convert_math.RULES, **convert_shape.RULES, **convert_nn.RULES, **opset23.RULES}
DOMAINS: dict[str, dict[str, Rule]] = {**{d: {**TABLE, **contrib.ONNX_DOMAIN_RULES} for d in DEFAULT_DOMAINS},
                                       contrib.DOMAIN: contrib.RULES}
