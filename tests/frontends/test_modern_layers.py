"""The layers of current decoders, each against its equations in numpy:
grouped-query and multi-query attention (query head h reads K/V head
h // group), query/key RMSNorm per head and across the projection, the
SwiGLU feed-forward, and the bias switches; masks through grouped attention
on the generated CUDA too."""
import math

import numpy as np
import pytest

from blockc import init_weights, run_reference, to_form, trace
from blockc.errors import ModelError
from blockc.frontends import FeedForward, InputSpec, Model, MultiHeadAttention, RMSNorm, symbol
from blockc.ir.dtypes import DType
from blockc.runtime.backend import make_backend

batch, seq = symbol("batch"), symbol("seq")
D, HEADS, HEAD = 32, 4, 8


class Attn(Model):
    def __init__(self, dtype=DType.float64, mask=False, **options):
        super().__init__()
        self.dtype, self.mask = dtype, mask
        self.attn = MultiHeadAttention(D, HEADS, causal=True, **options)

    def inputs(self):
        specs = [InputSpec("x", self.dtype, (batch, seq, D))]
        if self.mask:
            specs.append(InputSpec("mask", DType.bool, (batch, 1, 1, seq)))
        return specs

    def forward(self, x, mask=None):
        return {"y": self.attn(x, mask)}


def rms(x, g, eps=1e-6):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


def attention_numpy(x, w, heads, kv_heads, qk_norm="none", keep=None, prefix="attn."):
    """Self-attention written head by head: query head h reads K/V head h // (heads // kv_heads)."""
    def proj(name):
        y = x @ w[f"{prefix}w_{name}.weight"]
        return y + w[f"{prefix}w_{name}.bias"] if f"{prefix}w_{name}.bias" in w else y

    q, k, v = proj("q"), proj("k"), proj("v")
    if qk_norm == "full":
        q, k = rms(q, w[prefix + "q_norm.weight"]), rms(k, w[prefix + "k_norm.weight"])
    b, s, _ = x.shape
    q = q.reshape(b, s, heads, -1).transpose(0, 2, 1, 3)
    k = k.reshape(b, s, kv_heads, -1).transpose(0, 2, 1, 3)
    v = v.reshape(b, s, kv_heads, -1).transpose(0, 2, 1, 3)
    if qk_norm == "head":
        q, k = rms(q, w[prefix + "q_norm.weight"]), rms(k, w[prefix + "k_norm.weight"])
    out = np.empty(q.shape[:3] + (v.shape[-1],))
    allowed = np.tril(np.ones((s, s), bool)) & np.broadcast_to(True if keep is None else keep, (b, heads, s, s))
    for h in range(heads):
        g = h // (heads // kv_heads)
        scores = q[:, h] @ k[:, g].transpose(0, 2, 1) / math.sqrt(q.shape[-1])
        ok = allowed[:, h]
        scores = np.where(ok, scores, -np.inf)
        with np.errstate(invalid="ignore"):  # a fully masked row is NaN here
            p = np.exp(scores - scores.max(-1, keepdims=True))
            out[:, h] = (p / p.sum(-1, keepdims=True)) @ v[:, g]
    y = out.transpose(0, 2, 1, 3).reshape(b, s, -1) @ w[f"{prefix}w_o.weight"]
    return y + w[f"{prefix}w_o.bias"] if f"{prefix}w_o.bias" in w else y


def random_weights(model, seed=0):
    """Every weight random, norms around 1, so a misplaced norm or bias shows."""
    rng = np.random.default_rng(seed)
    return {name: (1 + 0.3 * rng.standard_normal(p.shape) if "norm" in name else 0.3 * rng.standard_normal(p.shape))
            for name, p in model.named_parameters()}


@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("qk_norm", ["none", "head", "full"])
def test_attention_matches_the_head_by_head_equations(kv_heads, qk_norm):
    model = Attn(kv_heads=kv_heads, qk_norm=qk_norm)
    w = random_weights(model)
    assert w["attn.w_k.weight"].shape == (D, kv_heads * HEAD)
    if qk_norm != "none":
        width = HEAD if qk_norm == "head" else None
        assert w["attn.q_norm.weight"].shape == (width or HEADS * HEAD,)
        assert w["attn.k_norm.weight"].shape == (width or kv_heads * HEAD,)
    x = np.random.default_rng(1).standard_normal((2, 6, D))
    got = run_reference(trace(model), w, {"x": x})["y"]
    np.testing.assert_allclose(got, attention_numpy(x, w, HEADS, kv_heads, qk_norm), rtol=1e-10, atol=1e-12)


def test_grouped_heads_are_not_copied():
    # K and V are viewed [batch, kv_heads, 1, seq, d] and broadcast in the product: no concat or gather of heads
    graph = trace(Attn(kv_heads=2))
    ops = graph.op_counts()
    assert "concat" not in ops and "gather" not in ops and "expand" not in ops
    products = [n for n in graph.nodes if n.op == "matmul" and n.inputs[0].type.rank == 5]
    assert [tuple(map(str, n.inputs[1].shape)) for n in products] == [
        ("batch", "2", "1", "8", "seq"), ("batch", "2", "1", "seq", "8")]


@pytest.mark.parametrize("form", ["standard", "fused"])
@pytest.mark.parametrize("backend", ["reference", "ort-cpu", "torch-eager", "cuda-emu"])
def test_grouped_attention_with_a_padding_mask(backend, form):
    # fused: the rank-5 masked softmax inside the attention op (on CUDA, its kernel folds the group dims)
    b = make_backend(backend)
    ok, why = b.availability()
    if not ok:
        pytest.skip(why)
    model = Attn(DType.float32, mask=True, kv_heads=2, qk_norm="head")
    graph = to_form(trace(model), form)
    assert ("attention" in graph.op_counts()) == (form == "fused")
    w = {k: v.astype(np.float32) for k, v in random_weights(model, 2).items()}
    x = np.random.default_rng(3).standard_normal((2, 5, D)).astype(np.float32)
    keep = np.array([[True] * 5, [False, False, True, True, True]])  # row 1 left-padded by 2
    got = b.run(graph, w, {"x": x, "mask": keep[:, None, None, :]})["y"]
    want = attention_numpy(x.astype(np.float64), w, HEADS, 2, "head", keep[:, None, None, :])
    # fully masked query rows (row 1's pads) average V in blockc and are NaN in the -inf oracle: compare the rest
    rows = np.isfinite(want).all(-1)
    assert rows.sum() == 8
    np.testing.assert_allclose(got[rows], want[rows], rtol=2e-4, atol=2e-5)


def test_a_mask_per_query_head_reaches_its_head():
    class PerHead(Attn):
        def inputs(self):
            return [InputSpec("x", self.dtype, (batch, seq, D)),
                    InputSpec("mask", DType.bool, (batch, HEADS, seq, seq))]

    model = PerHead(kv_heads=2)
    w = random_weights(model, 4)
    rng = np.random.default_rng(5)
    x, mask = rng.standard_normal((2, 4, D)), rng.random((2, HEADS, 4, 4)) < 0.6
    mask[..., 0] = True   # every query sees key 0: no fully masked row
    got = run_reference(trace(model), w, {"x": x, "mask": mask})["y"]
    np.testing.assert_allclose(got, attention_numpy(x, w, HEADS, 2, keep=mask), rtol=1e-10, atol=1e-12)


def test_a_mask_over_other_heads_is_refused():
    class ThreeHeads(Attn):
        def inputs(self):
            return [InputSpec("x", self.dtype, (batch, seq, D)), InputSpec("mask", DType.bool, (batch, 3, seq, seq))]

    with pytest.raises(ModelError, match=r"attention mask of shape \[batch,3,seq,seq\] has 3 heads, the attention 4"):
        trace(ThreeHeads(kv_heads=2))


def test_swiglu_matches_its_equation():
    class FFN(Model):
        dtype = DType.float64

        def __init__(self):
            super().__init__()
            self.ffn = FeedForward(D, 48, "silu", gated=True, bias=False)

        def inputs(self):
            return [InputSpec("x", DType.float64, (batch, seq, D))]

        def forward(self, x):
            return {"y": self.ffn(x)}

    model = FFN()
    w = random_weights(model, 6)
    assert sorted(w) == ["ffn.down.weight", "ffn.gate.weight", "ffn.up.weight"]  # no biases
    x = np.random.default_rng(7).standard_normal((2, 3, D))
    gate = x @ w["ffn.gate.weight"]
    want = (gate / (1 + np.exp(-gate)) * (x @ w["ffn.up.weight"])) @ w["ffn.down.weight"]
    np.testing.assert_allclose(run_reference(trace(model), w, {"x": x})["y"], want, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("options, present", [
    (dict(), {"w_q", "w_k", "w_v", "w_o"}),
    (dict(bias=False), set()),
    (dict(bias=True, out_bias=False), {"w_q", "w_k", "w_v"}),   # Qwen2
    (dict(bias=False, out_bias=True), {"w_o"}),
])
def test_bias_switches(options, present):
    names = {n for n, _ in Attn(**options).named_parameters()}
    assert {n.split(".")[1] for n in names if n.endswith(".bias")} == present


def test_rmsnorm_is_llamas():
    # Hugging Face's LlamaRMSNorm: weight * (x * rsqrt(mean(x^2) + eps)), eps inside the root
    class Norm(Model):
        dtype = DType.float64

        def __init__(self):
            super().__init__()
            self.norm = RMSNorm(D, eps=0.5)   # a large eps, so where it goes shows

        def inputs(self):
            return [InputSpec("x", DType.float64, (batch, D))]

        def forward(self, x):
            return {"y": self.norm(x)}

    model = Norm()
    w = random_weights(model, 8)
    x = np.random.default_rng(9).standard_normal((3, D)) * 0.5
    want = w["norm.weight"] * (x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 0.5))
    np.testing.assert_allclose(run_reference(trace(model), w, {"x": x})["y"], want, rtol=1e-13)


@pytest.mark.parametrize("options, message", [
    (dict(kv_heads=3), "heads=4 is not divisible by kv_heads=3"),
    (dict(kv_heads=-2), "heads=4 and kv_heads=-2 must be positive"),
    (dict(qk_norm="layer"), "unknown qk_norm 'layer': use none, head, full"),
])
def test_bad_attention_options_name_the_users_line(options, message):
    with pytest.raises(ModelError, match=message) as info:
        Attn(**options)
    assert str(info.value).startswith(__file__)
