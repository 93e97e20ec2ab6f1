"""The fused ``rotary`` op: its numpy meaning against Hugging Face's own RoPE
(Llama's rotate-half, GPT-J's interleaved pairs) on the tables blockc makes,
the same on every backend, and the shapes its rule refuses."""
import numpy as np
import pytest

from blockc.errors import ShapeError
from blockc.frontends.rotary import rope_table
from blockc.ir.dims import parse_dim
from blockc.ir.dtypes import DType
from blockc.ir.graph import Graph
from blockc.ir.types import TensorType
from blockc.ops import get
from blockc.runtime.backend import make_backend

B, H, S, D, P = 2, 3, 5, 16, 12


def T(dtype, *shape) -> TensorType:
    return TensorType(dtype, tuple(parse_dim(d) if isinstance(d, str) else d for d in shape))


def case(rd: int, interleaved: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, H, S, D))
    cos, sin = (rope_table((P, rd), fn=fn, base=10000.0, interleaved=interleaved) for fn in (np.cos, np.sin))
    pos = rng.integers(0, P, (B, S))
    return x, cos, sin, pos


def meaning(x, cos, sin, pos, interleaved):
    return get("rotary").numpy_fn([x, cos, sin, pos], {"interleaved": interleaved}, None)


@pytest.mark.parametrize("rd", [D, 8])
def test_rotate_half_is_hugging_faces_llama_rope(rd):
    torch = pytest.importorskip("torch")
    llama_rope = pytest.importorskip("transformers.models.llama.modeling_llama").apply_rotary_pos_emb
    x, cos, sin, pos = case(rd, interleaved=False)
    t = torch.tensor
    turned, _ = llama_rope(t(x[..., :rd]), t(x[..., :rd]), t(cos[pos]), t(sin[pos]), unsqueeze_dim=1)
    want = np.concatenate([turned.numpy(), x[..., rd:]], axis=-1)
    np.testing.assert_allclose(meaning(x, cos, sin, pos, False), want, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("rd", [D, 8])
def test_interleaved_is_hugging_faces_gptj_rope(rd):
    torch = pytest.importorskip("torch")
    gptj_rope = pytest.importorskip("transformers.models.gptj.modeling_gptj").apply_rotary_pos_emb
    x, cos, sin, pos = case(rd, interleaved=True)
    # GPT-J: heads after the sequence, one angle per pair
    bsnh = torch.tensor(x[..., :rd].transpose(0, 2, 1, 3))
    turned = gptj_rope(bsnh, torch.tensor(sin[:, ::2][pos]), torch.tensor(cos[:, ::2][pos])).numpy()
    want = np.concatenate([turned.transpose(0, 2, 1, 3), x[..., rd:]], axis=-1)
    np.testing.assert_allclose(meaning(x, cos, sin, pos, True), want, rtol=1e-13, atol=1e-14)


def graph(rd: int, interleaved: bool, dtype=DType.float32) -> Graph:
    g = Graph("rotary")
    x = g.add_input("x", T(dtype, "batch", H, "seq", D))
    pos = g.add_input("position_ids", T(DType.int64, "batch", "seq"))
    cos, sin = g.add_param("cos", T(dtype, P, rd)), g.add_param("sin", T(dtype, P, rd))
    g.set_outputs([("y", g.op("rotary", x, cos, sin, pos, interleaved=interleaved))])
    return g


@pytest.mark.parametrize("backend", ["reference", "ort-cpu", "torch-eager", "cuda-emu"])
@pytest.mark.parametrize("rd, interleaved", [(D, False), (8, True)])
def test_the_same_on_every_backend(backend, rd, interleaved):
    b = make_backend(backend)
    ok, why = b.availability()
    if not ok:
        pytest.skip(why)
    x, cos, sin, pos = case(rd, interleaved)
    g = graph(rd, interleaved)
    got = b.run(g, {"cos": cos.astype(np.float32), "sin": sin.astype(np.float32)},
                {"x": x.astype(np.float32), "position_ids": pos})["y"]
    np.testing.assert_allclose(got, meaning(x, cos, sin, pos, interleaved), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("types, words", [
    ((T(DType.float32, 2, 3, 5), T(DType.float32, 9, 4), T(DType.float32, 9, 4), T(DType.int64, 2, 5)),
     "x must be [batch, heads, seq, head_dim]"),
    ((T(DType.float32, 2, 3, 5, 8), T(DType.float32, 9, 10), T(DType.float32, 9, 10), T(DType.int64, 2, 5)),
     "the tables' 10 columns must be an even number of dims, at most the head size 8"),
    ((T(DType.float32, 2, 3, 5, 8), T(DType.float32, 9, 7), T(DType.float32, 9, 7), T(DType.int64, 2, 5)),
     "the tables' 7 columns must be an even number"),
    ((T(DType.float32, 2, 3, 5, 8), T(DType.float32, 9, 4), T(DType.float32, 9, 2), T(DType.int64, 2, 5)),
     "cos and sin must be tables"),
    ((T(DType.float32, 2, 3, 5, 8), T(DType.float32, 9, 4), T(DType.float32, 9, 4), T(DType.float32, 2, 5)),
     "position_ids must be int64 or int32"),
    ((T(DType.float32, 2, 3, 5, 8), T(DType.float32, 9, 4), T(DType.float32, 9, 4), T(DType.int64, 5, 2)),
     "position_ids must be [2,5] for x [2,3,5,8]"),
])
def test_the_shape_rule_refuses(types, words):
    with pytest.raises(ShapeError) as caught:
        get("rotary").infer_fn(list(types), {"interleaved": False})
    assert words in str(caught.value)
