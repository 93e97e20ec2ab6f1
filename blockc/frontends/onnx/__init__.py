"""Importing ONNX files: a checked reader (``safe_load``), the graph's
local functions inlined (``functions``), the operator table (``convert``)
and the model it builds (``model``)."""
from .model import OnnxModel, load_onnx  # noqa: F401
from .safe_load import read_onnx  # noqa: F401
