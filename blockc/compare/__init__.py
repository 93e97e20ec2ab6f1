"""``blockc compare``: what fusion buys and what it costs in accuracy.

Every form of a model (decomposed, standard, fused) on every available
backend, next to the peers (ONNX Runtime's transformer optimizer, PyTorch
eager, torch.compile), with one timing protocol and the float64 reference as
the judge of every number. See ``run.py``; the JSON is documented in
docs/compare-report.md.
"""

# Imported on first use (PEP 562), not with the package: ``run`` draws its
# charts with matplotlib, and the CLI reads ``compare.peers`` to build its
# parser on every command, where matplotlib would cost seconds.
_LAZY = ("CompareOptions", "plan_comparison", "planned_steps", "run_comparison")


def __getattr__(name: str):
    if name in _LAZY:
        from . import run
        return getattr(run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
