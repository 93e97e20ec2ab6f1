"""Rotary position embeddings: both pairings against the equations written
out in numpy here, partial rotation, the base, positions taken from the
input (left-padded rows, a decode step), the range check on those positions
on every backend, and the Llama converter's q/k row permutation that makes
an interleaved checkpoint a rotate-half one."""
import numpy as np
import pytest

from blockc import init_weights, run_reference, trace
from blockc.errors import InputsError, ModelError
from blockc.frontends import DecoderConfig, DecoderLM, InputSpec, Model, symbol
from blockc.frontends.rotary import RotaryEmbedding
from blockc.ir.dtypes import DType
from blockc.ops.limits import graph_limits
from blockc.runtime.backend import make_backend

batch, seq = symbol("batch"), symbol("seq")
HEADS, POSITIONS = 3, 40


class Rope(Model):
    """``rope(x, position_ids)`` on ``x: [batch, heads, seq, head_dim]``."""

    def __init__(self, head_dim=16, rotary_dim=None, base=10000.0, interleaved=False, dtype=DType.float64):
        super().__init__()
        self.head_dim, self.dtype = head_dim, dtype
        self.rope = RotaryEmbedding(head_dim, POSITIONS, rotary_dim, base, interleaved)

    def inputs(self):
        return [InputSpec("x", self.dtype, (batch, HEADS, seq, self.head_dim)),
                InputSpec("position_ids", DType.int64, (batch, seq), "positions", POSITIONS)]

    def forward(self, x, position_ids):
        return {"y": self.rope(x, position_ids)}


def rope_numpy(x, positions, rotary_dim, base, interleaved):
    """RoPE as its papers write it: pairs of dimensions turned by p * base^(-2i/d).
    Interleaved (Meta's Llama, GPT-J): pairs (2i, 2i+1) as complex numbers;
    rotate-half (GPT-NeoX, Hugging Face): pairs (i, i + d/2)."""
    x = x.astype(np.float64)
    half = rotary_dim // 2
    theta = base ** (-2.0 * np.arange(half) / rotary_dim)
    angle = positions[:, None, :, None] * theta          # [batch, 1, seq, half]
    out = x.copy()
    if interleaved:
        z = (x[..., 0:rotary_dim:2] + 1j * x[..., 1:rotary_dim:2]) * np.exp(1j * angle)
        out[..., 0:rotary_dim:2], out[..., 1:rotary_dim:2] = z.real, z.imag
    else:
        a, b = x[..., :half], x[..., half:rotary_dim]
        out[..., :half] = a * np.cos(angle) - b * np.sin(angle)
        out[..., half:rotary_dim] = b * np.cos(angle) + a * np.sin(angle)
    return out


def feeds(head_dim, rng, b=2, s=7):
    # row 0 counts from 0, row 1 is left-padded by 3 (its pads repeat position 0), as a batch of prompts is
    positions = np.array([np.arange(s), np.maximum(np.arange(s) - 3, 0)])[:b]
    return {"x": rng.standard_normal((b, HEADS, s, head_dim)), "position_ids": positions.astype(np.int64)}


@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate_half", "interleaved"])
@pytest.mark.parametrize("head_dim, rotary_dim, base", [(16, None, 10000.0), (16, 8, 10000.0), (12, 4, 500.0),
                                                        (8, 8, 1e6)])
def test_both_forms_match_the_equations(interleaved, head_dim, rotary_dim, base):
    model = Rope(head_dim, rotary_dim, base, interleaved)
    f = feeds(head_dim, np.random.default_rng(0))
    got = run_reference(trace(model), init_weights(model), f)["y"]
    want = rope_numpy(f["x"], f["position_ids"], rotary_dim or head_dim, base, interleaved)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    if rotary_dim:
        np.testing.assert_array_equal(got[..., rotary_dim:], f["x"][..., rotary_dim:])  # passed through


@pytest.mark.parametrize("backend", ["ort-cpu", "torch-eager"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate_half", "interleaved"])
def test_both_forms_on_other_backends(backend, interleaved):
    b = make_backend(backend)
    ok, why = b.availability()
    if not ok:
        pytest.skip(why)
    model = Rope(16, 12, 10000.0, interleaved, dtype=DType.float32)
    f = feeds(16, np.random.default_rng(1))
    f["x"] = f["x"].astype(np.float32)
    got = b.run(trace(model), dict(init_weights(model)), f)["y"]
    np.testing.assert_allclose(got, rope_numpy(f["x"], f["position_ids"], 12, 10000.0, interleaved),
                               rtol=1e-5, atol=1e-6)


def test_scores_depend_only_on_the_distance():
    # what RoPE is for: shifting every position by the same amount leaves q·k unchanged
    model = Rope(16)
    graph, weights = trace(model), init_weights(model)
    rng = np.random.default_rng(2)
    f = feeds(16, rng, b=1)
    f["position_ids"] = np.arange(7)[None].astype(np.int64)
    shifted = dict(f, position_ids=f["position_ids"] + 25)
    y0, y1 = (run_reference(graph, weights, g)["y"] for g in (f, shifted))
    assert not np.allclose(y0, y1)
    np.testing.assert_allclose(y0 @ np.swapaxes(y0, -1, -2), y1 @ np.swapaxes(y1, -1, -2), atol=1e-11)


@pytest.mark.parametrize("backend", ["reference", "ort-cpu"])
@pytest.mark.parametrize("bad", [-1, POSITIONS])
def test_positions_outside_the_table_are_refused(backend, bad):
    model = Rope(8)
    graph = trace(model)
    assert {k: high for k, (high, _) in graph_limits(graph).ids.items()} == {"position_ids": POSITIONS}
    f = feeds(8, np.random.default_rng(3))
    f["position_ids"][1, 2] = bad
    with pytest.raises(InputsError, match=rf"input 'position_ids': 1 of 14 ids out of range \[0, {POSITIONS}\)"):
        make_backend(backend).run(graph, dict(init_weights(model)), f)


@pytest.mark.parametrize("kwargs, message", [
    (dict(head_dim=16, rotary_dim=7), "rotary_dim=7 must be a positive even number"),
    (dict(head_dim=15), "the head size 15 is odd, and RoPE turns pairs of dimensions"),
    (dict(head_dim=15, rotary_dim=14), None),
    (dict(head_dim=16, rotary_dim=32), "rotary_dim=32 is more than the head size 16"),
    (dict(head_dim=16, base=0.0), "rope_theta must be a positive finite number"),
])
def test_bad_rope_settings_name_the_users_line(kwargs, message):
    if message is None:   # a partial rotation of an odd head is fine
        Rope(**kwargs)
        return
    with pytest.raises(ModelError, match=message) as info:
        Rope(**kwargs)
    assert str(info.value).startswith(__file__)


# ---- the converter's permutation ------------------------------------------------------
def permute_for_rotary(w, n_heads):
    """Hugging Face's convert_llama_weights_to_hf ``permute`` on an ``[out, in]``
    weight: within each head, the rows of pair (2i, 2i+1) go to i and i + d/2."""
    out, d_in = w.shape
    return w.reshape(n_heads, out // n_heads // 2, 2, d_in).transpose(0, 2, 1, 3).reshape(out, d_in)


def test_the_converters_permutation_turns_interleaved_into_rotate_half():
    settings = dict(vocab=50, max_positions=32, d_model=32, layers=2, heads=4, kv_heads=2, norm="rmsnorm",
                    activation="silu", gated_ffn=True, positions="rope", qkv_bias=False, out_bias=False,
                    ffn_bias=False, tie_embeddings=False, probs=False, dtype="float64")
    meta = DecoderLM(DecoderConfig(**settings, rope_form="interleaved"))
    hf = DecoderLM(DecoderConfig(**settings, rope_form="rotate_half"))
    weights = dict(init_weights(meta, seed=4))
    converted = dict(weights)
    for name, w in weights.items():
        # blockc's weights are [in, out]: permute the columns, as the converter permutes nn.Linear's rows
        if name.endswith("attn.w_q.weight"):
            converted[name] = permute_for_rotary(w.T, 4).T
        elif name.endswith("attn.w_k.weight"):
            converted[name] = permute_for_rotary(w.T, 2).T
    for name in ("rope.cos", "rope.sin"):  # the tables are each model's own
        converted[name] = init_weights(hf)[name]
    rng = np.random.default_rng(5)
    f = {"input_ids": rng.integers(0, 50, (2, 9)), "position_ids": rng.integers(0, 32, (2, 9))}
    want = run_reference(trace(meta), weights, f)["logits"]
    got = run_reference(trace(hf), converted, f)["logits"]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    # and the permutation matters: the unpermuted weights give other logits
    unpermuted = dict(weights, **{n: converted[n] for n in ("rope.cos", "rope.sin")})
    assert np.abs(run_reference(trace(hf), unpermuted, f)["logits"] - want).max() > 1e-3


def test_a_weights_file_cannot_substitute_the_rotary_tables(tmp_path):
    """The tables follow from the settings, and the fused op's ONNX Runtime
    encodings read one angle per pair: other tables would silently differ
    there, so a weights file holding them is refused, naming the table."""
    from blockc.cli import main
    from blockc.frontends import build_model, init_weights
    from blockc.frontends.weights import WeightsError, check_weights, save_weights
    model = build_model("llama-tiny", {})
    weights = dict(init_weights(model))
    check_weights(model, weights)   # the tables as made pass
    weights["rope.sin"] = weights["rope.sin"][:, ::-1].copy()
    with pytest.raises(WeightsError, match="fixed: rope.sin differs from the table the model's settings make"):
        check_weights(model, weights)
    path = str(tmp_path / "w.npz")
    save_weights(path, weights)
    assert main(["run", "llama-tiny", "--weights", path]) == 2
