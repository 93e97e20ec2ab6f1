"""The DSL: tracing, naming, initialisation, and errors that point at the user's line."""
import math
import textwrap

import numpy as np
import pytest

from blockc import build_model, init_weights, run_reference, trace, verify
from blockc.errors import BlockcError, ModelError
from blockc.frontends import (InputSpec, Linear, Model, MultiHeadAttention, Parameter, symbol,
                              scaled_dot_product_attention)
from blockc.ir.dtypes import DType

batch, seq = symbol("batch"), symbol("seq")


class Attn(Model):
    def __init__(self, mask_kind=None, causal=False):
        super().__init__()
        self.mask_kind, self.causal = mask_kind, causal

    def inputs(self):
        # float64, so the 1/sqrt(d_k) constant is exact and the check can be tight.
        specs = [InputSpec(n, DType.float64, (batch, 2, seq, 8)) for n in ("q", "k", "v")]
        if self.mask_kind == "bool":
            specs.append(InputSpec("mask", DType.bool, (batch, 1, seq, seq)))
        elif self.mask_kind == "additive":
            specs.append(InputSpec("mask", DType.float64, (batch, 1, seq, seq)))
        return specs

    def forward(self, q, k, v, mask=None):
        return scaled_dot_product_attention(q, k, v, mask, self.causal)


def attention_f64(q, k, v, keep=None, add=None):
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if add is not None:
        s = s + add
    if keep is not None:
        s = np.where(keep, s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("kind", [None, "bool", "additive", "causal"])
def test_attention_matches_the_formula(kind):
    model = Attn(kind if kind != "causal" else None, causal=kind == "causal")
    g = trace(model)
    verify(g)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 2, 5, 8)) for _ in range(3))
    feeds = {"q": q, "k": k, "v": v}
    keep = add = None
    if kind == "bool":
        keep = rng.random((2, 1, 5, 5)) > 0.3
        keep[..., 0] = True
        feeds["mask"] = keep
    elif kind == "additive":
        add = rng.standard_normal((2, 1, 5, 5))
        feeds["mask"] = add
    elif kind == "causal":
        keep = np.tril(np.ones((5, 5), bool))
    got = run_reference(g, {}, feeds)["output"]
    want = attention_f64(q, k, v, keep=keep, add=add)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_parameter_names_are_hierarchical_and_init_is_deterministic():
    m = build_model("tiny", {"layers": "3"})
    names = [n for n, _ in m.named_parameters()]
    assert "blocks.2.attn.w_q.weight" in names and "tok.weight" in names
    assert len(names) == len(set(names))
    a, b = init_weights(m, seed=1), init_weights(m, seed=1)
    name = "blocks.1.ffn.fc1.weight"
    np.testing.assert_array_equal(a[name], b[name])
    assert not np.array_equal(a[name], init_weights(m, seed=2)[name])
    assert a[name].std() == pytest.approx(0.02, rel=0.05)
    # A parameter's value does not depend on which other parameters exist.
    np.testing.assert_array_equal(init_weights(build_model("tiny", {"layers": "2"}), seed=1)[name], a[name])
    assert np.all(a["blocks.0.ln1.weight"] == 1)


def test_tied_head_is_one_parameter():
    g = trace(build_model("tiny"))
    assert "tok.weight" in g.params
    users = {n.op for n, _ in g.params["tok.weight"].uses}
    assert users == {"gather", "transpose"}


def test_sinusoidal_positions():
    m = build_model("tiny", {"positions": "sinusoidal"})
    table = init_weights(m)["pos.weight"]
    assert table[0, 0] == 0 and table[0, 1] == 1
    np.testing.assert_allclose(table[5, 2], math.sin(5 / 10000 ** (2 / 64)), rtol=1e-6)


def test_gpt3_shaped_model_traces_without_weights():
    m = build_model("gpt2", {"layers": "2", "d_model": "12288", "heads": "96"})
    g = trace(m)
    assert g.params["blocks.1.ffn.fc1.weight"].shape == (12288, 4 * 12288)


# ---- errors name the user's source line ---------------------------------------------
def line_of(source: str, needle: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if needle in line)


def load_user_model(tmp_path, body: str, name="build"):
    path = tmp_path / "user_model.py"
    path.write_text(textwrap.dedent(body))
    return str(path), path.read_text()


BAD_MATMUL = """
        from blockc.frontends import InputSpec, Model, Parameter, symbol
        from blockc.ir.dtypes import DType

        class Bad(Model):
            def __init__(self):
                super().__init__()
                self.w = Parameter((32, 8))

            def inputs(self):
                return [InputSpec("x", DType.float32, (symbol("batch"), 16))]

            def forward(self, x):
                return x @ self.w   # the bad line

        build = Bad
    """


def test_matmul_mismatch_names_user_line(tmp_path):
    path, src = load_user_model(tmp_path, BAD_MATMUL)
    with pytest.raises(ModelError) as info:
        trace(build_model(f"{path}:build"))
    msg = str(info.value)
    assert f"{path}:{line_of(src, 'the bad line')}" in msg
    assert "inner dimensions differ" in msg and "[batch,16] @ [32,8]" in msg


def test_naming_the_user_line_reads_no_source(tmp_path, monkeypatch):
    """Tracing names each node's user line (once per node: 3,000 for 96
    layers of GPT-3) from the frames alone; reading every frame's source
    line for it was most of the trace's time. The error still names the
    line."""
    import linecache
    path, src = load_user_model(tmp_path, BAD_MATMUL)
    model = build_model(f"{path}:build")

    def no_source(*args, **kwargs):
        raise AssertionError("a source line was read")
    monkeypatch.setattr(linecache, "getline", no_source)
    monkeypatch.setattr(linecache, "updatecache", no_source)
    monkeypatch.setattr(linecache, "checkcache", lambda *a, **k: None)
    with pytest.raises(ModelError) as info:
        trace(model)
    assert f"{path}:{line_of(src, 'the bad line')}" in str(info.value)


def test_heads_not_dividing_d_model_names_user_line(tmp_path):
    path, src = load_user_model(tmp_path, """
        from blockc.frontends import MultiHeadAttention
        def build():
            return MultiHeadAttention(100, 3)   # heads do not divide
    """)
    with pytest.raises(ModelError) as info:
        build_model(f"{path}:build")
    assert f"{path}:{line_of(src, 'heads do not divide')}" in str(info.value)
    assert "d_model=100 is not divisible by heads=3" in str(info.value)


def test_mask_of_wrong_shape_names_user_line():
    class BadMask(Attn):
        def inputs(self):
            return super().inputs()[:3] + [InputSpec("mask", DType.bool, (batch, 1, seq, 7))]

    with pytest.raises(ModelError) as info:
        trace(BadMask("bool"))
    msg = str(info.value)
    assert "attention mask of shape [batch,1,seq,7] does not broadcast" in msg
    assert "test_dsl.py" in msg  # Attn.forward, the user's code, made the call


def test_exception_in_user_file_is_reported_with_line(tmp_path):
    path, src = load_user_model(tmp_path, """
        x = 1
        raise RuntimeError("boom")   # here
    """)
    with pytest.raises(ModelError, match=f"user_model.py:{line_of(src, 'here')}.*boom"):
        build_model(f"{path}:build")


def test_user_file_errors(tmp_path):
    path, _ = load_user_model(tmp_path, "from blockc.frontends import Model\n")
    with pytest.raises(BlockcError, match="defines no 'nothing'"):
        build_model(f"{path}:nothing")
    with pytest.raises(BlockcError, match="not found"):
        build_model(f"{tmp_path}/missing.py:build")


def test_example_model_file_with_overrides():
    m = build_model("examples/custom_model.py:build", {"d_model": "32", "layers": "1"})
    g = trace(m)
    verify(g)
    assert g.inputs[0].shape == (batch, seq, 32) and "rmsnorm" in g.op_counts()
    rng = np.random.default_rng(0)
    out = run_reference(g, init_weights(m), {"features": rng.standard_normal((2, 3, 32)).astype(np.float32)})
    assert out["scores"].shape == (2, 3, 10) and np.isfinite(out["scores"]).all()


def test_module_must_call_super_init():
    class NoInit(Model):
        def __init__(self):
            self.w = Parameter((2, 2))

    with pytest.raises(ModelError, match="must call super"):
        NoInit()


def test_linear_is_x_at_w_plus_b():
    class One(Model):
        def __init__(self):
            super().__init__()
            self.lin = Linear(3, 2)

        def inputs(self):
            return [InputSpec("x", DType.float32, (4, 3))]

        def forward(self, x):
            return self.lin(x)

    m = One()
    w = {"lin.weight": np.arange(6, dtype=np.float32).reshape(3, 2), "lin.bias": np.array([1, -1], np.float32)}
    x = np.ones((4, 3), np.float32)
    np.testing.assert_allclose(run_reference(trace(m), w, {"x": x})["output"], x @ w["lin.weight"] + w["lin.bias"])


def test_mha_custom_head_sizes():
    class M(Model):
        def __init__(self):
            super().__init__()
            self.attn = MultiHeadAttention(16, 2, d_k=3, d_v=5)

        def inputs(self):
            return [InputSpec("x", DType.float32, (batch, seq, 16))]

        def forward(self, x):
            return self.attn(x)

    g = trace(M())
    assert g.params["attn.w_q.weight"].shape == (16, 6)
    assert g.params["attn.w_o.weight"].shape == (10, 16)
    assert g.outputs[0][1].shape == (batch, seq, 16)
