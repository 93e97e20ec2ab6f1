"""Adding a CUDA kernel family is one place: the family below, its template,
its emitter, its entries for two ops and the ops themselves are declared in
this file alone, registered, and run on the emulated CUDA backend against
the float64 reference with no other edit to blockc. The lowering finds the
family from the op's ``cuda``, the summary counts its kernels as fused, the
dtypes it declares are the only ones it is given, and two launches rendered
from the same parameters share one kernel definition. Everything declared
here is removed from the registries after the test."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from blockc.codegen.cuda.family import FAMILIES, KernelFamily, KernelStep, register
from blockc.codegen.cuda.kernel import CudaCodegenError, KernelCode, ctype, shape_class, suffix
from blockc.codegen.cuda.templates import environment
from blockc.ir.dims import parse_dim
from blockc.ir.dtypes import DType
from blockc.ir.graph import Graph
from blockc.ir.types import TensorType
from blockc.ir.verify import verify
from blockc.ops import registry
from blockc.ops._rules import elementwise
from blockc.runtime.backend import make_backend
from blockc.runtime.reference import run_reference

BATCH, SEQ, WIDTH = parse_dim("batch"), parse_dim("seq"), 12

# One thread a row: reduce the row into `acc` by the op's entry, then write x minus it.
TEMPLATE = """// {{ name }}: x minus its row's {{ title }}; one thread a row.
// IR nodes: {{ nodes }}
__global__ void {{ name }}(const {{ T }}* __restrict__ x, {{ T }}* __restrict__ y, long long rows, long long cols) {
  for (long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x; r < rows; r += (long long)gridDim.x * blockDim.x) {
    float acc = {{ init }};
    for (long long c = 0; c < cols; ++c) { const float v = blockc_to_compute(x[r * cols + c]); acc = {{ step }}; }
    const float shift = {{ finish }};
    for (long long c = 0; c < cols; ++c)
      y[r * cols + c] = blockc_from_compute<{{ T }}>(blockc_to_compute(x[r * cols + c]) - shift);
  }
}

static void {{ name }}_launch(const {{ T }}* x, {{ T }}* y, long long rows, long long cols, cudaStream_t stream) {
  if (rows <= 0) return;
  long long blocks = (rows + 127) / 128;
  if (blocks > 65535LL) blocks = 65535LL;
  BLOCKC_LAUNCH({{ name }}, dim3((unsigned)blocks), dim3(128), 0, stream, x, y, rows, cols);
}
"""


@dataclass(frozen=True)
class RowShift:
    """The family's entry for an op: what it subtracts from each row, as C."""

    title: str
    init: str
    step: str
    finish: str


def declare():
    template = environment().from_string(TEMPLATE)

    def emit_row_shift(step: KernelStep) -> list[KernelCode]:
        node, ctx = step.node, step.ctx
        x, y = node.inputs[0], node.outputs[0]
        entry = family.entry(node.op)
        name = f"{node.op}_{suffix(y.dtype)}_{shape_class(x.shape)}"
        params = dict(title=entry.title, T=ctype(y.dtype), init=entry.init, step=entry.step, finish=entry.finish)
        args = [ctx.ptr(x), ctx.ptr(y), ctx.numel(x.shape[:-1]), ctx.dim(x.shape[-1])]
        return [KernelCode(name, template, params, lambda n: f"{n}_launch({', '.join(args)}, stream);", step.labels,
                           [node.op], ("",))]

    family = register(KernelFamily(
        "row_shift", "row shift", emit_row_shift, frozenset({DType.float32}), fused=True,
        entries={"row_center": RowShift("mean", "0.0f", "acc + v", "acc / cols"),
                 "row_shift_max": RowShift("maximum", "-INFINITY", "(v > acc ? v : acc)", "acc")}))
    for op, numpy in (("row_center", lambda x: x - x.mean(-1, keepdims=True)),
                      ("row_shift_max", lambda x: x - x.max(-1, keepdims=True))):
        d = registry.define(op, ("x",), doc=f"x minus its row's {family.entry(op).title}", cuda="row_shift")
        d.infer(lambda types, attrs, op=op: elementwise(op, types, floats=True))
        d.numpy(lambda xs, attrs, env, numpy=numpy: numpy(xs[0]))
    return family


@pytest.fixture
def row_shift():
    try:
        yield declare()
    finally:
        for op in ("row_center", "row_shift_max"):
            registry.OPS.pop(op, None)
        FAMILIES.pop("row_shift", None)


def model(dtype: DType = DType.float32) -> Graph:
    g = Graph("row_shift_model")
    x = g.add_input("x", TensorType(dtype, (BATCH, SEQ, WIDTH)))
    w = g.add_param("w", TensorType(dtype, (WIDTH,)))
    h = g.op("row_center", g.op("mul", g.op("row_center", x), w))
    g.set_outputs([("y", g.op("row_shift_max", h))])
    verify(g)
    return g


def expected(x, w):
    x, w = x.astype(np.float64), w.astype(np.float64)
    center = lambda v: v - v.mean(-1, keepdims=True)   # noqa: E731
    h = center(center(x) * w)
    return h - h.max(-1, keepdims=True)


def test_a_new_family_runs_emulated_against_the_reference(row_shift):
    b = make_backend("cuda-emu")
    ok, why = b.availability()
    if not ok:
        pytest.skip(why)
    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal(WIDTH).astype(np.float32)}
    feeds = {"x": rng.standard_normal((2, 5, WIDTH)).astype(np.float32)}
    got = b.run(model(), weights, feeds)["y"]
    np.testing.assert_allclose(got, run_reference(model(), weights, feeds)["y"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, expected(feeds["x"], weights["w"]), rtol=1e-5, atol=1e-5)


def test_the_lowering_and_the_summary_read_the_family(row_shift):
    from blockc.codegen.cuda.lower import generate, lowers
    from blockc.report.cuda_summary import families_of_functions

    assert lowers(registry.get("row_center"))
    cm = generate(model(), {"w": np.ones(WIDTH, np.float32)})
    assert [s.ops for s in cm.steps] == [["row_center"], ["mul"], ["row_center"], ["row_shift_max"]]
    # both row_center launches are rendered from the same parameters: one definition
    assert [name for name in cm.kernels if name.startswith("row_")] == ["row_center_f32_12", "row_shift_max_f32_12"]
    assert cm.source.count("__global__ void row_center_f32_12(") == 1
    families = families_of_functions(cm)
    assert families["row_center_f32_12"] is row_shift and families["row_center_f32_12"].fused
    assert not families["ew_mul_f32_12"].fused


def test_a_dtype_the_family_does_not_declare_is_refused_by_name(row_shift):
    from blockc.codegen.cuda.lower import generate

    with pytest.raises(CudaCodegenError, match=r"\(row_center\): the CUDA row shift kernel generates float32, "
                                               r"not float16"):
        generate(model(DType.float16), {"w": np.ones(WIDTH, np.float16)})
