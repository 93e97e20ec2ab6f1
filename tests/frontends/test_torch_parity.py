"""DSL transformer blocks against PyTorch's nn.TransformerEncoderLayer.

The block is declared with the DSL, its weights copied from a randomly
initialised torch layer, and both run on the same input: PyTorch is the
outside oracle for the block's equations, the norm placement, the mask
conventions and the weight layout.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from blockc import run_reference, trace  # noqa: E402
from blockc.frontends import BlockConfig, BlockModel, InputSpec, Model, TransformerBlock, symbol  # noqa: E402
from blockc.frontends.weights import check_weights  # noqa: E402
from blockc.ir.dtypes import DType  # noqa: E402
# onnxruntime is a dependency: a missing run_ort is a failure, never a skip
from blockc.runtime.ort_runner import run_ort  # noqa: E402

D_MODEL, HEADS, D_FF = 32, 4, 64
BATCH, SEQ = 2, 7
TOL = 1e-5


def torch_layer(norm_first: bool, seed: int = 0) -> nn.TransformerEncoderLayer:
    """A torch encoder layer with every parameter random.

    torch initialises the attention biases to 0 and the norms to (1, 0); left
    so, a wrong bias or norm mapping would go unnoticed.
    """
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, D_FF, dropout=0.0, activation="relu",
                                       batch_first=True, norm_first=norm_first)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name.startswith("norm") and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif p.ndim == 1:
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
    return layer.eval()


def encoder_layer_weights(layer: nn.TransformerEncoderLayer, prefix: str) -> dict:
    """blockc weights for a ``TransformerBlock`` named ``prefix`` from a torch layer.

    torch's projections are nn.Linear, stored ``[out, in]`` (y = x Wᵀ + b);
    blockc's Linear is ``[in, out]`` (y = x W + b): every matrix is transposed.
    ``in_proj_weight`` stacks the q, k and v projections as rows: ``[3d, d]``.
    """
    def t(x):
        return x.detach().numpy().astype(np.float32)

    d = layer.self_attn.embed_dim
    w_in, b_in = t(layer.self_attn.in_proj_weight), t(layer.self_attn.in_proj_bias)
    out = {}
    for i, name in enumerate(("w_q", "w_k", "w_v")):
        out[f"{prefix}attn.{name}.weight"] = np.ascontiguousarray(w_in[i * d:(i + 1) * d].T)
        out[f"{prefix}attn.{name}.bias"] = b_in[i * d:(i + 1) * d].copy()
    out[f"{prefix}attn.w_o.weight"] = np.ascontiguousarray(t(layer.self_attn.out_proj.weight).T)
    out[f"{prefix}attn.w_o.bias"] = t(layer.self_attn.out_proj.bias)
    out[f"{prefix}ffn.fc1.weight"] = np.ascontiguousarray(t(layer.linear1.weight).T)
    out[f"{prefix}ffn.fc1.bias"] = t(layer.linear1.bias)
    out[f"{prefix}ffn.fc2.weight"] = np.ascontiguousarray(t(layer.linear2.weight).T)
    out[f"{prefix}ffn.fc2.bias"] = t(layer.linear2.bias)
    out[f"{prefix}ln1.weight"], out[f"{prefix}ln1.bias"] = t(layer.norm1.weight), t(layer.norm1.bias)
    out[f"{prefix}ln2.weight"], out[f"{prefix}ln2.bias"] = t(layer.norm2.weight), t(layer.norm2.bias)
    return out


def block_model(norm_first: bool, causal: bool) -> BlockModel:
    return BlockModel(BlockConfig(d_model=D_MODEL, heads=HEADS, d_ff=D_FF, norm_first=norm_first,
                                  activation="relu", causal=causal, eps=1e-5, layers=1))


def torch_forward(layer, x: np.ndarray, causal: bool, mask_style: str = "generate") -> np.ndarray:
    xt = torch.from_numpy(x)
    with torch.no_grad():
        if not causal:
            return layer(xt).numpy()
        if mask_style == "generate":
            mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
            return layer(xt, src_mask=mask, is_causal=True).numpy()
        # a hand-made float mask: -inf above the diagonal, no is_causal hint
        mask = torch.triu(torch.full((x.shape[1], x.shape[1]), float("-inf")), diagonal=1)
        return layer(xt, src_mask=mask).numpy()


def random_input(seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((BATCH, SEQ, D_MODEL)).astype(np.float32)


CASES = [pytest.param(nf, c, id=f"{'pre' if nf else 'post'}-norm-{'causal' if c else 'full'}")
         for nf in (False, True) for c in (False, True)]


@pytest.mark.parametrize("norm_first,causal", CASES)
def test_block_matches_torch_encoder_layer(norm_first, causal):
    layer = torch_layer(norm_first)
    model = block_model(norm_first, causal)
    weights = check_weights(model, encoder_layer_weights(layer, "blocks.0."))  # strict: names, shapes, dtypes
    x = random_input()
    expected = torch_forward(layer, x, causal)
    got = run_reference(trace(model), weights, {"x": x}, float64=False)["y"]
    assert got.dtype == np.float32
    err = np.abs(got - expected).max()
    assert err <= TOL, f"max abs error {err:.3g}"


def test_causal_block_matches_additive_inf_mask():
    layer = torch_layer(norm_first=True, seed=3)
    model = block_model(norm_first=True, causal=True)
    x = random_input(4)
    expected = torch_forward(layer, x, causal=True, mask_style="additive")
    got = run_reference(trace(model), encoder_layer_weights(layer, "blocks.0."), {"x": x}, float64=False)["y"]
    assert np.abs(got - expected).max() <= TOL


def test_causal_flag_matters():
    # The causal and the full block must differ on the same weights, else the
    # causal cases above would pass for a block that ignores the mask.
    layer = torch_layer(norm_first=False)
    x = random_input()
    assert np.abs(torch_forward(layer, x, True) - torch_forward(layer, x, False)).max() > 1e-2


class MaskedBlock(Model):
    """A TransformerBlock with a boolean key mask input (True = may attend)."""

    name = "masked_block"

    def __init__(self, norm_first: bool):
        super().__init__()
        self.block = TransformerBlock(D_MODEL, HEADS, D_FF, norm_first=norm_first, activation="relu")

    def inputs(self):
        b, s = symbol("batch"), symbol("seq")
        return [InputSpec("x", DType.float32, (b, s, D_MODEL)), InputSpec("mask", DType.bool, (b, 1, 1, s))]

    def forward(self, x, mask):
        return self.block(x, mask)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_padding_mask_matches_torch_key_padding_mask(norm_first):
    # torch's src_key_padding_mask is True where a key is padding (hidden);
    # blockc's boolean masks are True where attention is allowed: the negation.
    layer = torch_layer(norm_first, seed=5)
    model = MaskedBlock(norm_first)
    x = random_input(6)
    lengths = [SEQ, 4]
    pad = np.arange(SEQ)[None, :] >= np.array(lengths)[:, None]  # [batch, seq], True = padding
    with torch.no_grad():
        expected = layer(torch.from_numpy(x), src_key_padding_mask=torch.from_numpy(pad)).numpy()
    feeds = {"x": x, "mask": (~pad)[:, None, None, :]}
    got = run_reference(trace(model), encoder_layer_weights(layer, "block."), feeds, float64=False)["output"]
    for b, n in enumerate(lengths):  # padded query rows are not meaningful outputs
        assert np.abs(got[b, :n] - expected[b, :n]).max() <= TOL


@pytest.mark.parametrize("norm_first,causal", CASES)
def test_block_on_onnx_runtime_matches_torch(norm_first, causal):
    layer = torch_layer(norm_first)
    model = block_model(norm_first, causal)
    x = random_input()
    expected = torch_forward(layer, x, causal)
    got = run_ort(trace(model), encoder_layer_weights(layer, "blocks.0."), {"x": x})["y"]
    err = np.abs(np.asarray(got, dtype=np.float32) - expected).max()
    assert err <= TOL, f"max abs error {err:.3g}"
