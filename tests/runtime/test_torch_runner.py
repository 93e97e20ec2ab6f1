"""The PyTorch runner: every built-in model in every form against the float64
reference at two shapes with one module, every op of the registry on a
hand-written graph (KV cache, masks, symbolic slices), torch.compile, and the
errors (a missing op, a failed compile, no torch)."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")

import blockc  # noqa: E402
from blockc.errors import BlockcError, WeightsError  # noqa: E402
from blockc.frontends.catalog import build_model  # noqa: E402
from blockc.ops.registry import OPS  # noqa: E402
from blockc.runtime.torch_runner import TorchSession, lower_to_torch, run_torch, torch_available  # noqa: E402

SMALL = {"layers": "1", "d_model": "64", "heads": "4"}
MODELS = [
    ("tiny", {}),
    ("gpt2", {**SMALL, "vocab": "97", "max_positions": "32"}),
    ("gpt2-block", {"d_model": "64", "heads": "4"}),
    ("bert-base", {**SMALL, "vocab": "97", "max_positions": "32"}),
    # the other norm, activation and positions: rmsnorm, add_rmsnorm, relu, a constant table
    ("tiny", {"norm": "rmsnorm", "activation": "relu", "positions": "sinusoidal"}),
    # post-norm, erf GELU, no causal mask
    ("gpt2-block", {"d_model": "64", "heads": "4", "norm_first": "false", "activation": "gelu", "causal": "false"}),
    # RoPE, grouped-query attention (rank-5 scores), SwiGLU's silu, QK-norm
    ("llama-tiny", {"layers": "1"}),
    ("qwen3-tiny", {"layers": "1", "rope_form": "interleaved", "rotary_dim": "16", "kv_heads": "1"}),
]
SHAPES = [{"batch": 2, "seq": 5}, {"batch": 1, "seq": 11}]
# torch's own import of inductor warns about its own deprecated torch.jit use
INDUCTOR_IMPORT = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")


def sample(model, bindings, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    return {spec.name: spec.sample(bindings, rng) for spec in model.inputs()}


def assert_matches(graph, got: dict, want: dict, tol: float = 1e-4) -> None:
    """float32 against float64: max abs error <= tol, relative to the largest
    value where values are large (logits)."""
    assert list(got) == [name for name, _ in graph.outputs]
    for name, ref in want.items():
        have = got[name]
        assert have.dtype == graph.output(name).dtype.numpy, name
        assert have.shape == ref.shape, name
        if not graph.output(name).dtype.is_float:
            np.testing.assert_array_equal(have, ref, err_msg=name)
            continue
        scale = max(1.0, float(np.max(np.abs(ref)))) if ref.size else 1.0
        err = float(np.max(np.abs(have.astype(np.float64) - ref))) if ref.size else 0.0
        assert err <= tol * scale, f"{name}: max abs error {err:.3g} > {tol} x {scale:.3g}"


@pytest.mark.parametrize("form", blockc.FORMS)
@pytest.mark.parametrize("name,overrides", MODELS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(MODELS)])
def test_builtin_models_match_the_float64_reference(name, overrides, form):
    model = build_model(name, overrides)
    graph = blockc.to_form(blockc.trace(model), form)
    weights = blockc.init_weights(model, seed=0)
    session = TorchSession(graph, weights)
    for i, bindings in enumerate(SHAPES):  # one module, two shapes: symbolic dims work
        feeds = sample(model, bindings, seed=i)
        assert_matches(graph, session.run(feeds), blockc.run_reference(graph, weights, feeds))

    code = session.module.code
    if form == "fused" and "kv_heads" in model.cfg.__dict__ and model.cfg.kv_heads not in (0, model.cfg.heads):
        # grouped-query attention's core is rank 5 ([b, kv_heads, group, s, d]): spelled out, not SDPA
        assert "scaled_dot_product_attention" not in code and "torch.matmul" in code
    elif form == "fused":   # the fused ops reach torch as the fused calls
        assert "scaled_dot_product_attention" in code and "linear" in code
        assert "torch.cat" not in code  # the QKV weights were concatenated once, at build time
    elif form == "decomposed":
        assert "layer_norm" not in code and "softmax" not in code and "gelu" not in code
    else:
        assert "layer_norm" in code or "rms_norm" in code
        assert "softmax" in code and "scaled_dot_product_attention" not in code


# Every op of the registry, in the corners the built-in models do not reach:
# a KV cache (rows != cols in the causal masks), additive, boolean and fully
# masked rows, broadcast attention, symbolic reshape targets and slice bounds,
# reductions, casts, gathers off axis 0, outputs that are inputs or weights,
# and a preallocated cache of 12 rows written at `past`.
KV_GRAPH = """
graph kv(%ids: i64[batch,seq], %past: f32[batch,past,16], %bias: f32[batch,1,1,past+seq], %keep: bool[batch,1,seq,past+seq], %buf: f32[batch,2,12,8]) {
  param @wte: f32[20,16]
  param @g: f32[16]
  param @beta: f32[16]
  param @w: f32[16,48]
  param @b: f32[48]
  param @rope: f32[20,8]
  %0:f32[batch,seq,16] = gather @wte, %ids {axis=0}
  %1:f32[batch,seq,48] = matmul_bias_act %0, @w, @b {activation="gelu"}
  %2:f32[batch,seq,16], %3:f32[batch,seq,16], %4:f32[batch,seq,16] = split %1 {axis=-1, sizes=[16,16,16]}
  %5:f32[batch,past+seq,16] = concat %past, %3 {axis=1}
  %6:f32[batch,past+seq,16] = concat %past, %4 {axis=1}
  %7:f32[batch,seq,2,8] = reshape %2 {shape=[batch,seq,2,-1]}
  %8:f32[batch,2,seq,8] = transpose %7 {perm=[0,2,1,3]}
  %9:f32[batch,past+seq,2,8] = reshape %5 {shape=[0,0,2,8]}
  %10:f32[batch,2,past+seq,8] = transpose %9 {perm=[0,2,1,3]}
  %11:f32[batch,past+seq,2,8] = reshape %6 {shape=[batch,past+seq,2,8]}
  %12:f32[batch,2,past+seq,8] = transpose %11 {perm=[0,2,1,3]}
  %13:f32[batch,2,seq,8] = attention %8, %10, %12, %bias {scale=0.35, mask="additive", causal=true}
  %14:f32[batch,2,seq,8] = attention %8, %10, %12, %keep {scale=0.35, mask="bool"}
  %15:f32[batch,2,seq,8] = attention %8, %10, %12 {causal=true}
  %16:f32[batch,2,8,past+seq] = transpose %10 {perm=[0,1,3,2]}
  %17:f32[batch,2,seq,past+seq] = matmul %8, %16
  %18:f32[batch,2,seq,past+seq] = masked_softmax %17, %keep {scale=0.35, mask="bool", causal=true}
  %19:f32[batch,2,seq,past+seq] = masked_softmax %17, %bias {mask="additive"}
  %20:f32[batch,seq,16] = attention %0, %5, %6 {scale=0.25, causal=true}
  %21:f32[batch,seq,16], %22:f32[batch,seq,16] = add_rmsnorm %0, %3, @g {with_sum=true}
  %23:f32[] = constant {value=dense<f32[]: [2.0]>}
  %24:f32[batch,seq,16] = pow %22, %23
  %25:f32[batch,seq,16] = neg %24
  %26:f32[batch,seq,16] = exp %25
  %27:f32[batch,seq,16] = add %26, %23
  %28:f32[batch,seq,16] = reciprocal %27
  %29:f32[batch,seq,16] = erf %21
  %30:f32[batch,seq,16] = relu %29
  %31:f32[batch,seq,16] = tanh %30
  %90:f32[batch,seq,16] = sin %31
  %91:f32[batch,seq,16] = cos %90
  %92:f32[batch,seq,16] = sigmoid %91
  %32:f32[batch,seq,16] = sqrt %27
  %33:f32[batch,seq,16] = sub %92, %32
  %34:f32[batch,seq,16] = div %33, %28
  %35:f32[batch,16] = reduce_max %34 {axes=[1], keepdims=false}
  %36:f32[batch,seq,1] = reduce_sum %34 {axes=[-1]}
  %37:f32[batch,1,16] = reduce_mean %34 {axes=[1]}
  %38:f32[batch,seq] = cast %ids {to="f32"}
  %39:bool[batch,seq] = cast %ids {to="bool"}
  %40:f32[batch,1,16] = slice %21 {axis=1, start=seq-1, end=seq}
  %41:i64[3] = constant {value=dense<i64[3]: [3, 0, 5]>}
  %42:f32[batch,seq,3] = gather %21, %41 {axis=2}
  %43:bool[seq,past+seq] = causal_mask {rows=seq, cols=past+seq}
  %44:f32[batch,2,seq,past+seq] = where %43, %17, %23
  %45:f32[batch,2,seq,past+seq] = softmax %44 {axis=1}
  %46:f32[batch,seq,16] = layernorm %34, @g, @beta {eps=1e-5}
  %47:f32[batch,seq,16] = gelu %46 {approximate="tanh"}
  %48:f32[batch,seq,16], %49:f32[batch,seq,16] = add_layernorm %47, %0, @g, @beta {eps=1e-5, with_sum=true}
  %50:f32[batch,seq,16] = rmsnorm %48, @g {eps=1e-6}
  %51:f32[16,48] = mul @w, @w
  %52:f32[batch,seq,48] = matmul_bias_act %50, %51, @b {activation="relu"}
  %53:f32[batch,seq,48] = matmul_bias_act %50, @w, @b {activation="gelu_tanh"}
  %54:f32[batch,past,2,8] = reshape %past {shape=[0,0,2,8]}
  %55:f32[48,16] = transpose @w {perm=[1,0]}
  %56:f32[batch,seq,16] = qkv_attention %0, @w, @b {heads=2, sizes=[16,16,16], scale=0.35, causal=true}
  %57:f32[batch,seq,16] = qkv_attention %0, @w, @b {heads=4, sizes=[16,16,16]}
  %58:f32[batch,seq,16] = silu %34
  %59:f32[batch,2,seq,8] = rotary %8, @rope, @rope, %ids {interleaved=true}
  %60:f32[batch,2,12,8] = cache_write %buf, %8 {axis=2, start=past}
  %61:f32[batch,2,seq,8], %62:f32[batch,2,12,8], %63:f32[batch,2,12,8] = cache_attention %8, %8, %8, %buf, %buf {scale=0.35, causal=true, start=past}
  %64:i64[seq] = arange {n=seq}
  %65:i64[] = dim_value {value=past+seq}
  %66:bool[seq] = less %64, %65
  %67:bool[seq] = less_equal %64, %65
  %68:bool[seq] = greater %64, %65
  %69:bool[seq] = greater_equal %64, %65
  %70:bool[seq] = equal %64, %65
  %71:bool[seq] = logical_and %66, %67
  %72:bool[seq] = logical_or %68, %70
  %73:bool[seq] = logical_not %69
  %74:bool[batch,seq] = expand %71 {shape=[batch,seq]}
  %75:f32[batch,seq,16] = all_reduce %58 {world=1}
  %76:f32[batch,seq,16] = all_gather %75 {axis=-1, world=1}
  %77:i64[batch,seq] = cumsum %ids {axis=1}
  %78:f32[batch,seq,16] = cumsum %34 {axis=1, exclusive=true, reverse=true}
  %79:f32[batch,2,past,8] = transpose %54 {perm=[0,2,1,3]}
  %80:f32[batch,2,seq,8], %81:f32[batch,2,past+seq,8], %82:f32[batch,2,past+seq,8] = append_attention %8, %8, %8, %79, %79, %keep {scale=0.35, mask="bool", guarded=true}
  return aa=%80, ap=%81, cs=%77, cr=%78, t1=%72, ar=%76, t2=%73, t3=%74, s=%59, cw=%60, ca=%61, cb=%62, qa=%56, qb=%57, r=%58, a=%13, b=%14, c=%15, d=%18, e=%19, f=%20, g=%35, h=%36, i=%37, j=%38, k=%39, l=%40, m=%42, n=%45, o=%49, p=%52, q=%53, past_out=%past, w_out=@w, mask=%43, past_view=%54, w_t=%55
}
"""


def kv_feeds(batch, seq, past, seed) -> dict:
    rng = np.random.default_rng(seed)
    keep = rng.random((batch, 1, seq, past + seq)) < 0.5
    keep[0, 0, 0, :] = False  # a fully masked row: blockc averages v, it does not make NaN
    return {"ids": rng.integers(0, 20, (batch, seq)), "past": rng.standard_normal((batch, past, 16)).astype(np.float32),
            "bias": rng.standard_normal((batch, 1, 1, past + seq)).astype(np.float32), "keep": keep,
            "buf": rng.standard_normal((batch, 2, 12, 8)).astype(np.float32)}


@pytest.mark.parametrize("fold_constants", [True, False])
def test_every_op_on_a_kv_cache_graph(fold_constants):
    graph = blockc.parse_graph(KV_GRAPH)
    assert set(graph.op_counts()) == set(OPS), "a new op: add it to this graph"
    missing = [name for name, op in OPS.items() if op.torch_fn is None and op.decompose_fn is None]
    assert not missing, f"ops with neither a torch rule nor a decomposition: {missing}"
    rng = np.random.default_rng(0)
    weights = {name: (rng.standard_normal(v.type.concrete_shape({})) * 0.5).astype(np.float32)
               for name, v in graph.params.items()}
    session = TorchSession(graph, weights, fold_constants=fold_constants)
    for i, (batch, seq, past) in enumerate([(2, 3, 4), (1, 6, 2)]):
        feeds = kv_feeds(batch, seq, past, seed=i)
        got = session.run(feeds)
        assert_matches(graph, got, blockc.run_reference(graph, weights, feeds))
        # outputs never alias inputs or weights, not even as views
        assert not np.shares_memory(got["past_out"], feeds["past"])
        assert not np.shares_memory(got["past_view"], feeds["past"])
        got["w_out"][...] = 0
        got["w_t"][...] = 0
    again = session.run(kv_feeds(1, 2, 1, seed=5))
    assert np.array_equal(again["w_out"], weights["w"]) and np.array_equal(again["w_t"], weights["w"].T)
    folded = [k for k, t in session.module.named_buffers() if k.startswith("mul") and tuple(t.shape) == (16, 48)]
    assert bool(folded) == fold_constants  # %51 = mul @w, @w: folded or not


def test_lowered_module_is_an_fx_graph_module_holding_the_weights():
    model = build_model("gpt2-block", {"d_model": "64", "heads": "4"})
    graph, weights = blockc.trace(model), blockc.init_weights(model, seed=0)
    module = lower_to_torch(graph, weights)
    assert isinstance(module, torch.fx.GraphModule)
    params = dict(module.named_parameters())
    assert len(params) == len(graph.params)
    np.testing.assert_array_equal(params["blocks_0_attn_w_q_weight"].numpy(), weights["blocks.0.attn.w_q.weight"])
    x = np.random.default_rng(0).standard_normal((1, 4, 64)).astype(np.float32)
    with torch.inference_mode():
        y = module(torch.from_numpy(x))["y"]
    np.testing.assert_allclose(y.numpy(), run_torch(graph, weights, {"x": x})["y"], rtol=0, atol=0)


@INDUCTOR_IMPORT
def test_torch_compile_matches_the_reference():
    model = build_model("gpt2-block", {"d_model": "32", "heads": "2"})
    graph = blockc.to_form(blockc.trace(model), "fused")
    weights = blockc.init_weights(model, seed=0)
    session = TorchSession(graph, weights, compile=True, threads=1)
    feeds = sample(model, {"batch": 1, "seq": 6})
    want = blockc.run_reference(graph, weights, feeds)
    for _ in range(2):  # the first run compiles, the second reuses it
        assert_matches(graph, session.run(feeds), want)


@INDUCTOR_IMPORT
def test_a_failed_compile_is_a_blockc_error_saying_why():
    model = build_model("gpt2-block", {"d_model": "32", "heads": "2"})
    graph, weights = blockc.trace(model), blockc.init_weights(model, seed=0)

    def no_compiler(gm, example_inputs):
        raise RuntimeError("no C++ compiler found (tried g++, clang++)")

    session = TorchSession(graph, weights, compile=True, backend=no_compiler)
    with pytest.raises(BlockcError, match=r"torch.compile could not compile the model: RuntimeError: no C\+\+ "):
        session.run(sample(model, {"batch": 1, "seq": 3}))


def test_a_missing_op_names_the_op_and_the_node(monkeypatch):
    model = build_model("tiny", {"layers": "1"})
    graph = blockc.trace(model)
    matmul_line = next(line for line in str(graph).splitlines() if "= matmul " in line)
    label = matmul_line.split(":")[0].strip()  # "%5"
    monkeypatch.setattr(OPS["matmul"], "torch_fn", None)   # no decomposition to fall back on
    with pytest.raises(BlockcError, match=rf"no lowering for op 'matmul' \(node {label} = matmul"):
        TorchSession(graph, blockc.init_weights(model, seed=0))


def test_an_op_without_a_torch_rule_runs_as_its_decomposition(monkeypatch):
    model = build_model("tiny", {"layers": "1"})
    graph, weights = blockc.trace(model), dict(blockc.init_weights(model, seed=0))
    feeds = {s.name: s.sample({"batch": 2, "seq": 4}, np.random.default_rng(0)) for s in model.inputs()}
    monkeypatch.setattr(OPS["gelu"], "torch_fn", None)
    got = TorchSession(graph, weights).run(feeds)
    want = blockc.run_reference(graph, weights, feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5)


def test_threads_apply_to_the_run_and_are_restored():
    model = build_model("gpt2-block", {"d_model": "32", "heads": "2"})
    graph, weights = blockc.trace(model), blockc.init_weights(model, seed=0)
    before = torch.get_num_threads()
    seen = []
    session = TorchSession(graph, weights, threads=1)
    real = session.module.forward
    session.module.forward = lambda *a: (seen.append(torch.get_num_threads()), real(*a))[1]
    session.run(sample(model, {"batch": 1, "seq": 3}))
    assert seen == [1] and torch.get_num_threads() == before
    with pytest.raises(BlockcError, match="threads must be a positive integer"):
        TorchSession(graph, weights, threads=0)


def test_bad_weights_and_feeds_are_blockc_errors():
    model = build_model("gpt2-block", {"d_model": "32", "heads": "2"})
    graph, weights = blockc.trace(model), blockc.init_weights(model, seed=0)
    with pytest.raises(WeightsError, match="no weights for 1 parameter"):
        TorchSession(graph, {k: v for k, v in weights.items() if k != "blocks.0.ln1.weight"})
    with pytest.raises(WeightsError, match="has shape"):
        TorchSession(graph, {**weights, "blocks.0.ln1.weight": np.ones(7, np.float32)})
    session = TorchSession(graph, weights)
    with pytest.raises(BlockcError, match="dtype float64, expected float32"):
        session.run({"x": np.ones((1, 3, 32))})


def test_half_precision_models_round_trip_through_numpy():
    for dtype, tol in (("float16", 2e-3), ("bfloat16", 1.6e-2)):
        model = build_model("gpt2-block", {"d_model": "32", "heads": "2", "dtype": dtype})
        graph, weights = blockc.trace(model), blockc.init_weights(model, seed=0)
        feeds = sample(model, {"batch": 1, "seq": 4})
        assert_matches(graph, TorchSession(graph, weights).run(feeds),
                       blockc.run_reference(graph, weights, feeds), tol=tol)


def test_without_torch_blockc_imports_and_says_how_to_get_it(monkeypatch):
    code = ("import sys; sys.modules['torch'] = None\n"
            "import blockc\nfrom blockc.runtime import torch_runner\nprint(torch_runner.torch_available())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "(False, 'torch is not installed (pip install torch)')"

    monkeypatch.setitem(sys.modules, "torch", None)
    assert torch_available() == (False, "torch is not installed (pip install torch)")
    with pytest.raises(BlockcError, match=r"needs torch: torch is not installed \(pip install torch\)"):
        TorchSession(blockc.parse_graph("graph g(%x: f32[2]) {\n  return y=%x\n}\n"), {})


def test_labels_that_are_not_python_identifiers():
    graph = blockc.parse_graph("""
graph g(%self: f32[n,2], %lambda: f32[n,2], %"x.y": f32[n,2]) {
  param @forward: f32[2]
  param @training: f32[2]
  param @0.w: f32[2]
  %0:f32[n,2] = add %self, %lambda
  %1:f32[n,2] = add %0, %"x.y"
  %2:f32[n,2] = mul %1, @forward
  %3:f32[n,2] = mul %2, @training
  %4:f32[n,2] = add %3, @0.w
  return "out.1"=%4, self=%self
}
""")
    weights = {"forward": np.full(2, 2, np.float32), "training": np.full(2, 3, np.float32),
               "0.w": np.ones(2, np.float32)}
    feeds = {name: np.ones((3, 2), np.float32) for name in ("self", "lambda", "x.y")}
    session = TorchSession(graph, weights)
    assert session.module.training is False and callable(session.module.forward)
    assert_matches(graph, session.run(feeds), blockc.run_reference(graph, weights, feeds))
