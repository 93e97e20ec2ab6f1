"""Every built-in model, exported: full checker, dynamic batch/seq in ONNX
Runtime, and agreement with the float64 reference at two sequence lengths,
in every form."""
import numpy as np
import onnx
import pytest

from blockc import build_model, init_weights, run_reference, to_form, trace
from blockc.codegen.onnx_export import export_onnx
from blockc.frontends.catalog import BUILTINS
from blockc.runtime.ort_runner import OrtSession


def small(name):
    sets = {"layers": "2", "d_model": "32", "heads": "4"}
    if "vocab" in BUILTINS[name].config.__dataclass_fields__:
        sets["vocab"] = "97"
    return build_model(name, sets)


@pytest.mark.parametrize("form", ["standard", "decomposed", "fused"])
@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_builtin_model_on_onnx_runtime(name, form):
    model = small(name)
    graph = to_form(trace(model), form)
    weights = dict(init_weights(model, seed=5))
    proto = export_onnx(graph, weights)
    onnx.checker.check_model(proto, full_check=True)
    dims = [d.dim_param for d in proto.graph.input[0].type.tensor_type.shape.dim]
    assert dims[:2] == ["batch", "seq"]
    session = OrtSession(graph, weights)
    oracle_graph = trace(model)
    rng = np.random.default_rng(0)
    for batch, seq in [(1, 3), (3, 11)]:
        feeds = {s.name: s.sample({"batch": batch, "seq": seq}, rng) for s in model.inputs()}
        got = session.run(feeds)
        want = run_reference(oracle_graph, weights, feeds)
        for k in want:
            assert got[k].shape == want[k].shape
            np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=2e-5, err_msg=f"{name} {form} {k}")
