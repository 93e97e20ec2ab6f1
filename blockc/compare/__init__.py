"""``blockc compare``: what fusion buys and what it costs in accuracy.

Every form of a model (decomposed, standard, fused) on every available
backend, next to the peers (ONNX Runtime's transformer optimizer, PyTorch
eager, torch.compile), with one timing protocol and the float64 reference as
the judge of every number. See ``run.py``; the JSON is documented in
docs/compare-report.md.
"""
from .run import CompareOptions, plan_comparison, planned_steps, run_comparison  # noqa: F401
