"""Import rules for ONNX's arithmetic: elementwise operators (with NumPy
broadcasting), comparisons and logic, Where, Max/Min, the reductions, CumSum,
MatMul and Gemm. Each folds known operands by the numpy rule of the blockc
op it would emit (``convert._fold``) and otherwise emits that op."""
from __future__ import annotations

import numpy as np

from ...ir.dtypes import DType
from ..tensor import apply
from .convert import (Rule, Unsupported, _attr, _axes, _fold, _known, _operands, _reshaped, _shape_of, in_range,
                      ints_of, is_tensor, tensor)


def _refuse_axis_broadcast(node):
    if _attr(node, "axis") is not None:   # before opset 7, B could be aligned at an axis, not at the end
        raise Unsupported(f"{node.op_type} broadcasting along axis {_attr(node, 'axis')} (opset < 7)")


def _elementwise(ir_op: str):
    def run(node, ins, ctx):
        _refuse_axis_broadcast(node)
        if not any(is_tensor(v) for v in ins):
            return [_fold(ir_op, *ins)]
        return [apply(ir_op, *_operands(ins))]
    return Rule(run)


def _pow(node, ins, ctx):
    _refuse_axis_broadcast(node)
    base, exponent = ins
    # Pow's exponent has its own type (T1); the result has the base's
    if not is_tensor(base) and not is_tensor(exponent):
        if np.asarray(base).dtype != np.asarray(exponent).dtype:
            exponent = _fold("cast", exponent, to=DType.from_numpy(np.asarray(base).dtype).name)
        return [_fold("pow", base, exponent)]
    if is_tensor(base) and not is_tensor(exponent) and base.dtype.is_float:
        exponent = np.asarray(_known(exponent)).astype(base.dtype.numpy)
    elif is_tensor(base) and is_tensor(exponent) and base.dtype != exponent.dtype:
        if not base.dtype.is_float:
            raise Unsupported(f"Pow of a {base.dtype.name} base with a {exponent.dtype.name} exponent")
        exponent = exponent.cast(base.dtype)
    return [apply("pow", *_operands([base, exponent]))]


def _isnan(node, ins, ctx):
    (x,) = ins
    if not is_tensor(x):
        return [_fold("logical_not", _fold("equal", x, x))]
    return [apply("logical_not", apply("equal", x, x))]


def _extremum(pick: str):
    """Max/Min of any number of operands: ``where(a pick b, a, b)`` pairwise."""
    def run(node, ins, ctx):
        if not any(is_tensor(v) for v in ins):
            out = ins[0]
            for v in ins[1:]:
                out = _fold("where", _fold(pick, out, v), out, v)
            return [out]
        out, *rest = _operands(ins)
        for v in rest:
            out = apply("where", apply(pick, out, v), out, v)
        return [out]
    return Rule(run)


def _matmul(node, ins, ctx):
    known = not any(is_tensor(v) for v in ins)
    a, b = ins if known else _operands(ins)
    if not _shape_of(a) or not _shape_of(b):
        raise Unsupported("MatMul of a scalar")
    # a 1-D operand is a row on the left or a column on the right, that axis dropped after (numpy's rule)
    drop = [k for k, vector in ((-2, len(_shape_of(a)) == 1), (-1, len(_shape_of(b)) == 1)) if vector]
    a = _reshaped(a, [1, _shape_of(a)[0]]) if len(_shape_of(a)) == 1 else a
    b = _reshaped(b, [_shape_of(b)[0], 1]) if len(_shape_of(b)) == 1 else b
    y = _fold("matmul", a, b) if known else apply("matmul", a, b)
    if drop:
        y = _reshaped(y, [d for k, d in enumerate(_shape_of(y)) if k - len(_shape_of(y)) not in drop])
    return [y]


def _gemm(node, ins, ctx):
    a, b, c = (list(ins) + [None])[:3]
    a, b = _operands([a, b])
    if _attr(node, "transA", 0):
        a = a.T
    if _attr(node, "transB", 0):
        b = b.T
    y = a @ b
    alpha, beta = _attr(node, "alpha", 1.0), _attr(node, "beta", 1.0)
    if alpha != 1.0:
        y = y * np.array(alpha, y.dtype.numpy)
    if c is not None and beta != 0.0:
        c = tensor(c, y)
        y = y + (c if beta == 1.0 else c * np.array(beta, y.dtype.numpy))
    return [y]


def _reduce(ir_op: str, axes_input_since: int):
    def run(node, ins, ctx):
        x = ins[0]
        rank = len(_shape_of(x))
        axes = _axes(node, ins if node.opset >= axes_input_since else ins[:1], 1, rank, repeats=True)
        if not axes and _attr(node, "noop_with_empty_axes", 0):
            return [x]   # no axes given and told so: the input unchanged, not a full reduction
        axes = axes or list(range(rank))
        keep = bool(_attr(node, "keepdims", 1))
        if not is_tensor(x):
            return [_fold(ir_op, x, axes=axes, keepdims=keep)]
        return [apply(ir_op, x, axes=axes, keepdims=keep)]
    return Rule(run)


def _where(node, ins, ctx):
    cond, x, y = ins
    if not any(is_tensor(v) for v in ins):
        return [_fold("where", cond, x, y)]
    ref = x if is_tensor(x) else y
    return [apply("where", tensor(cond), tensor(x, ref if is_tensor(ref) else None),
                  tensor(y, ref if is_tensor(ref) else None))]


def _cumsum(node, ins, ctx):
    x, axis = ins
    if is_tensor(axis):
        raise Unsupported("CumSum's axis is computed at run time (blockc needs it known)")
    axis = in_range("input axis", int(ints_of(axis)[0]), len(_shape_of(x)))
    flags = {f: bool(_attr(node, f, 0)) for f in ("exclusive", "reverse")}
    return [apply("cumsum", x, axis=axis, **flags) if is_tensor(x) else _fold("cumsum", x, axis=axis, **flags)]


def _unary(ir_op: str):
    def run(node, ins, ctx):
        (x,) = ins
        return [apply(ir_op, x) if is_tensor(x) else _fold(ir_op, x)]
    return Rule(run)



# ONNX op type -> how it is imported (ai.onnx)
RULES: dict[str, Rule] = {
    "Add": _elementwise("add"), "Sub": _elementwise("sub"), "Mul": _elementwise("mul"), "Div": _elementwise("div"),
    "Pow": Rule(_pow), "Equal": _elementwise("equal"), "Less": _elementwise("less"),
    "LessOrEqual": _elementwise("less_equal"), "Greater": _elementwise("greater"),
    "GreaterOrEqual": _elementwise("greater_equal"), "And": _elementwise("logical_and"),
    "Or": _elementwise("logical_or"), "Not": _unary("logical_not"), "IsNaN": Rule(_isnan), "Neg": _unary("neg"),
    "Sqrt": _unary("sqrt"), "Reciprocal": _unary("reciprocal"), "Exp": _unary("exp"), "Tanh": _unary("tanh"),
    "Relu": _unary("relu"), "Erf": _unary("erf"), "Sin": _unary("sin"), "Cos": _unary("cos"),
    "Sigmoid": _unary("sigmoid"), "MatMul": Rule(_matmul), "Gemm": Rule(_gemm),
    "ReduceMean": _reduce("reduce_mean", 18), "ReduceSum": _reduce("reduce_sum", 13),
    "ReduceMax": _reduce("reduce_max", 18), "Max": _extremum("greater"), "Min": _extremum("less"),
    "Where": Rule(_where), "CumSum": Rule(_cumsum, since=11),
}
