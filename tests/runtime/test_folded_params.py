"""fold_params: parameter-only nodes become parameters of their own, computed
by the op's numpy rule; golden IR, what must not fold, and numbers against
the unfolded graph on the float64 reference and on ONNX Runtime."""
from __future__ import annotations

import os
import textwrap
import time

import numpy as np
import onnx
import pytest

from blockc import parse_graph, run_reference, verify
from blockc.errors import WeightsError
from blockc.runtime.folded_params import fold_params
from blockc.runtime.ort_runner import run_ort


def ir(text: str) -> str:
    return textwrap.dedent(text).strip("\n") + "\n"


def random_weights(graph, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(tuple(v.shape)).astype(v.dtype.numpy) for name, v in graph.params.items()}


def folded_weights(folded, weights) -> dict:
    """What the folded graph runs on: the originals it still reads, and the made arrays."""
    return {name: weights[name] if name in weights else folded.make(name) for name in folded.graph.params}


def test_docstring_example():
    before = parse_graph(ir("""
        graph g(%x: f32[batch,seq,64]) {
          param @w_q: f32[64,64]
          param @w_k: f32[64,32]
          param @w_v: f32[64,32]
          %0:f32[64,128] = concat @w_q, @w_k, @w_v {axis=1}
          %1:f32[batch,seq,128] = matmul %x, %0
          return y=%1
        }
    """))
    text = str(before)
    folded = fold_params(before, random_weights(before))
    verify(folded.graph)
    assert str(folded.graph) == ir("""
        graph g(%x: f32[batch,seq,64]) {
          param @"concat(w_q,w_k,w_v){axis=1}": f32[64,128]
          %0:f32[batch,seq,128] = matmul %x, @"concat(w_q,w_k,w_v){axis=1}"
          return y=%0
        }
    """)
    assert str(before) == text   # the input graph is left as it was
    assert folded.leaves == {"concat(w_q,w_k,w_v){axis=1}": ["w_q", "w_k", "w_v"]}


def test_a_folded_name_writes_the_attributes_as_the_printer_does_joined_by_a_bare_comma():
    """The name keeps each attribute as ``format_attrs`` prints it (a float's
    repr, a string quoted), the attributes joined by ``,`` alone."""
    before = parse_graph(ir("""
        graph g(%x: f32[batch,8]) {
          param @w: f32[8,16]
          %0:f32[8,4] = slice @w {axis=1, start=2, end=6}
          %1:f32[batch,4] = matmul %x, %0
          return y=%1
        }
    """))
    folded = fold_params(before, random_weights(before))
    assert list(folded.leaves) == ["slice(w){axis=1,start=2,end=6}"]


CHAINS = """
    graph g(%x: f32[batch,seq,8], %ids: i64[batch,seq]) {
      param @w: f32[8,8]
      param @tok: f32[16,8]
      param @cos: f32[32,4]
      %0:f32[8,4], %1:f32[8,4] = split @w {axis=1, sizes=[4,4]}
      %2:f32[8,8] = concat %1, %0 {axis=1}
      %3:f32[8,8] = transpose %2 {perm=[1,0]}
      %4:f32[batch,seq,8] = matmul %x, %3
      %5:f32[batch,seq,8] = gather @tok, %ids
      %6:f32[8,16] = transpose @tok {perm=[1,0]}
      %7:f32[batch,seq,16] = matmul %4, %6
      %8:f32[seq,4] = slice @cos {axis=0, start=0, end=seq}
      %9:f32[] = constant {value=dense<f32[]: [2.0]>}
      %10:f32[8,8] = mul @w, %9
      %11:f32[batch,seq,8] = matmul %5, %10
      %12:f32[16,8] = neg @tok
      return y=%7, z=%11, c=%8, t=%12
    }
"""


def test_chains_fold_to_what_unfolded_nodes_read_and_the_rest_stays():
    """A chain (split, its two results concatenated, transposed) becomes one
    parameter named after the whole chain; a parameter still read elsewhere
    (``tok``, gathered) stays beside its fold; a slice to a symbolic end, a
    node over a constant (constant folding's) and a graph output stay."""
    g = parse_graph(ir(CHAINS))
    folded = fold_params(g, random_weights(g))
    verify(folded.graph)
    chain = "transpose(concat(split(w){axis=1,sizes=[4,4]}#1,split(w){axis=1,sizes=[4,4]}#0){axis=1}){perm=[1,0]}"
    assert list(folded.graph.params) == ["w", "tok", "cos", chain, "transpose(tok){perm=[1,0]}"]
    assert folded.graph.op_counts() == {"matmul": 3, "gather": 1, "slice": 1, "constant": 1, "mul": 1, "neg": 1}
    assert folded.leaves[chain] == ["w"]


def test_a_node_two_inputs_share_is_computed_once(monkeypatch):
    """The chain's split feeds both inputs of its concat: made once."""
    from blockc.runtime import folded_params
    g = parse_graph(ir(CHAINS))
    folded = fold_params(g, random_weights(g))
    ran, real = [], folded_params.evaluate_node
    monkeypatch.setattr(folded_params, "evaluate_node", lambda n, *a: ran.append(n.op) or real(n, *a))
    folded.make(next(name for name in folded.derived if name.startswith("transpose(concat")))
    assert ran == ["split", "concat", "transpose"]


def test_folded_graph_computes_what_the_graph_did():
    g = parse_graph(ir(CHAINS))
    w = random_weights(g)
    folded = fold_params(g, w)
    fw = folded_weights(folded, w)
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((2, 3, 8)).astype(np.float32), "ids": rng.integers(0, 16, (2, 3))}
    want = run_reference(g, w, feeds, float64=True)
    for name, got in run_reference(folded.graph, fw, feeds, float64=True).items():
        np.testing.assert_array_equal(got, want[name])
    for name, got in run_ort(folded.graph, fw, feeds).items():
        np.testing.assert_allclose(got, want[name], rtol=1e-5, atol=1e-5, err_msg=name)


def test_bfloat16_folds_exactly():
    g = parse_graph(ir("""
        graph g(%x: bf16[seq,4]) {
          param @a: bf16[4,2]
          param @b: bf16[4,3]
          %0:bf16[4,5] = concat @a, @b {axis=1}
          %1:bf16[seq,5] = matmul %x, %0
          return y=%1
        }
    """))
    w = random_weights(g)
    [(name, made)] = [(n, fold_params(g, w).make(n)) for n in fold_params(g, w).derived]
    assert made.dtype == w["a"].dtype and made.flags.c_contiguous
    assert np.array_equal(made.view(np.uint16), np.concatenate([w["a"], w["b"]], axis=1).view(np.uint16))


def test_a_transpose_larger_than_a_tile_is_made_exactly():
    """Transposed matrices are copied tile by tile (``weights.contiguous``): tiles cut at both edges."""
    g = parse_graph(ir("""
        graph g(%x: f32[seq,300]) {
          param @w: f32[600,300]
          %0:f32[300,600] = transpose @w {perm=[1,0]}
          %1:f32[seq,600] = matmul %x, %0
          return y=%1
        }
    """))
    w = random_weights(g)
    folded = fold_params(g, w)
    made = folded.make("transpose(w){perm=[1,0]}")
    assert made.flags.c_contiguous and np.array_equal(made, w["w"].T)


def test_nothing_to_fold_and_only_some_parameters():
    g = parse_graph(ir(CHAINS))
    assert fold_params(parse_graph(ir("""
        graph g(%x: f32[seq,4]) {
          param @w: f32[4,4]
          %0:f32[seq,4] = matmul %x, @w
          return y=%0
        }
    """)), {}) is None
    folded = fold_params(g, random_weights(g), only=lambda name: name != "w")
    assert list(folded.derived) == ["transpose(tok){perm=[1,0]}"]
    assert fold_params(g, {}, only=lambda name: False) is None


@pytest.fixture(scope="module")
def gpt2_steps():
    """A one-layer GPT-2's fused prefill and decode graphs, and its weights."""
    from blockc.frontends import build_model, init_weights
    from blockc.generate.decoder import as_decoder
    from blockc.generate.loop import _graphs, _steps
    model = as_decoder(build_model("gpt2", {"layers": 1, "d_model": 32, "heads": 2, "vocab": 64, "max_positions": 32, "d_ff": 64}))
    steps, names = _steps(model, [[1, 2, 3]], 8, True)
    weights = {name: np.asarray(a) for name, a in init_weights(model, seed=0).items()}
    return [g for g, _ in _graphs(steps, weights, "fused", names.pairs, None, False)], weights


def test_prefill_and_decode_name_their_folds_alike(gpt2_steps):
    """The QKV merges and the tied head's transpose, named the same in both
    graphs (so both sessions can read one array), and nothing left that
    ONNX Runtime would fold."""
    (prefill, decode), w = gpt2_steps
    a, b = fold_params(prefill, w), fold_params(decode, w)
    assert list(a.derived) == list(b.derived) and len(a.derived) == 3
    assert {k: v.type for k, v in a.derived.items()} == {k: v.type for k, v in b.derived.items()}
    assert "blocks.0.attn.w_q.weight" not in a.graph.params and "tok.weight" in a.graph.params
    assert fold_params(a.graph, folded_weights(a, w)) is None


# -- ONNX Runtime over a .safetensors file: folded once into the cache, mapped by every session -------------
FEEDS = {"input_ids": np.array([[5, 9, 13]]), "attention_mask": np.ones((1, 3), np.int64),
         "position_ids": np.array([[0, 1, 2]])}


@pytest.fixture
def on_file(gpt2_steps, tmp_path, monkeypatch):
    """Saves weights to a .safetensors file and loads them back as views of
    it, the file not racy (the clock ``later_s`` on: a file written in the
    last 2 s could be rewritten keeping its stat, ``files.racy``);
    an empty cache."""
    from blockc import files
    from blockc.frontends.weights import load_weights, save_weights
    monkeypatch.setenv("BLOCKC_CACHE", str(tmp_path / "cache"))
    files.CACHE_COUNTS.clear()
    path = tmp_path / "w.safetensors"

    def saved(weights, later_s=10):
        save_weights(path, weights)
        monkeypatch.setattr(files, "_now_ns", lambda: time.time_ns() + later_s * 10**9)
        return load_weights(path)
    return saved


def sessions_made(monkeypatch) -> list:
    """The serialized models ONNX Runtime is given."""
    import onnxruntime
    made, real = [], onnxruntime.InferenceSession

    def spy(model, *a, **k):
        made.append(onnx.load_from_string(model))
        return real(model, *a, **k)
    monkeypatch.setattr(onnxruntime, "InferenceSession", spy)
    return made


def over_initializers(model) -> list[str]:
    """The op of each node that reads initializers alone: what ONNX Runtime would fold."""
    names = {t.name for t in model.graph.initializer}
    return [n.op_type for n in model.graph.node if n.input and all(i in names for i in n.input)]


def test_sessions_read_folded_weights_from_one_cached_file(gpt2_steps, on_file, monkeypatch, tmp_path):
    """The prefill's and decode's sessions get no node over initializers to
    fold: the QKV merges and the tied head come made, as views of one cache
    file (the decode's session finding it made), the same region in both;
    the outputs are the unfolded session's and the float64 reference's."""
    from blockc import files
    from blockc.frontends.weights import file_region
    from blockc.runtime.ort_runner import OrtSession
    (prefill, decode), w = gpt2_steps
    made = sessions_made(monkeypatch)
    mapped = on_file(w)
    with OrtSession(prefill, mapped) as a, OrtSession(decode, mapped) as b:
        assert [over_initializers(m) for m in made] == [[], []]
        derived = list(fold_params(prefill, w).derived)
        regions = [{name: file_region(s.weights[name]) for name in derived} for s in (a, b)]
        assert regions[0] == regions[1]
        assert {os.path.dirname(r.path) for r in regions[0].values()} == \
            {str(files.cache_root() / "weights" / os.listdir(files.cache_root() / "weights")[0])}
        assert dict(files.CACHE_COUNTS)[("weights", "miss")] == 1 and files.CACHE_COUNTS["weights", "hit"] == 1
        got = a.run(FEEDS)
    unfolded = run_ort(prefill, w, FEEDS)   # in memory: ONNX Runtime folds them itself
    want = run_reference(prefill, w, FEEDS, float64=True)
    for name in want:
        np.testing.assert_array_equal(got[name], unfolded[name])
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4, err_msg=name)


def test_rewritten_weights_are_folded_afresh(gpt2_steps, on_file):
    from blockc import files
    (prefill, _), w = gpt2_steps
    first = run_ort(prefill, on_file(w), FEEDS)["logits"]
    changed = {name: a * 0.5 for name, a in w.items()}
    got = run_ort(prefill, on_file(changed), FEEDS)["logits"]
    assert files.CACHE_COUNTS["weights", "miss"] == 2
    np.testing.assert_allclose(got, run_reference(prefill, changed, FEEDS, float64=True)["logits"],
                               rtol=1e-4, atol=1e-4)
    assert not np.allclose(got, first, rtol=1e-3, atol=1e-3)



def test_weights_replaced_after_mapping_are_not_cached_under_the_new_file(gpt2_steps, on_file, tmp_path):
    """A long-lived process maps the file; ``rsync``/``cp`` + ``mv``/``git
    checkout`` then put a new file (a new inode) at its path. Its next session
    would fold from the OLD bytes and have ONNX Runtime read the NEW file at
    the old offsets: it is refused, naming the file, and nothing is kept
    under the new file's key, which every later run on the new file would
    hit (issue 24)."""
    from blockc import files
    from blockc.frontends.weights import load_weights, save_weights
    (prefill, _), w = gpt2_steps
    old = on_file(w)
    changed = {name: a * 0.5 for name, a in w.items()}
    save_weights(tmp_path / "new.safetensors", changed)
    os.replace(tmp_path / "new.safetensors", tmp_path / "w.safetensors")
    with pytest.raises(WeightsError, match="w.safetensors was replaced or changed after its weights were loaded"):
        run_ort(prefill, old, FEEDS)
    assert not any(kind == "weights" for kind, _ in files.CACHE_COUNTS)   # the old bytes: nothing cached
    got = run_ort(prefill, load_weights(tmp_path / "w.safetensors"), FEEDS)["logits"]
    assert files.CACHE_COUNTS["weights", "miss"] == 1 and files.CACHE_COUNTS["weights", "hit"] == 0
    np.testing.assert_array_equal(got, run_ort(prefill, changed, FEEDS)["logits"])

def test_in_memory_and_just_written_weights_are_left_to_onnx_runtime(gpt2_steps, on_file, monkeypatch):
    """In-memory weights, or a file written just now (whose stat a rewrite
    could keep): the graph goes as it is, ONNX Runtime folds, nothing is cached."""
    from blockc import files
    from blockc.runtime.ort_runner import OrtSession
    (prefill, _), w = gpt2_steps
    made = sessions_made(monkeypatch)
    for weights in (w, on_file(w, later_s=0)):
        with OrtSession(prefill, weights) as s:
            assert sorted(s.weights) == sorted(prefill.params)
    assert [sorted(over_initializers(m)) for m in made] == [["Concat", "Concat", "Transpose"]] * 2
    assert not any(kind == "weights" for kind, _ in files.CACHE_COUNTS)


ARITHMETIC = """
    graph g(%x: f16[seq,4]) {
      param @a: f16[4,4]
      param @b: f16[4,4]
      param @s: f16[4]
      param @lora_a: f16[4,2]
      param @lora_b: f16[2,4]
      %0:f16[4,8] = concat @a, @b {axis=1}
      %1:f16[4,4] = mul @a, @s
      %2:f16[4,4] = matmul @lora_a, @lora_b
      %3:f16[4,4] = add %1, %2
      %4:f16[seq,8] = matmul %x, %0
      %5:f16[seq,4] = matmul %x, %3
      return y=%4, z=%5
    }
"""


def test_arithmetic_over_parameters_is_left_to_onnx_runtime(gpt2_steps, on_file, monkeypatch):
    """Only ops that move data fold (the registry's ``moves_data``): a scale
    folded into a weight or a matmul of two parameters (a LoRA merge) would
    round in numpy's float16, not as ONNX Runtime's kernels do, so ONNX
    Runtime folds those itself; the concat beside them still comes made.
    The outputs are the unfolded session's, bit for bit."""
    from blockc.runtime.ort_runner import OrtSession
    g = parse_graph(ir(ARITHMETIC))
    w = random_weights(g)
    folded = fold_params(g, w)
    assert list(folded.derived) == ["concat(a,b){axis=1}"]
    assert folded.graph.op_counts() == {"mul": 1, "matmul": 3, "add": 1}
    made = sessions_made(monkeypatch)
    feeds = {"x": np.random.default_rng(1).standard_normal((3, 4)).astype(np.float16)}
    with OrtSession(g, on_file(w)) as session:
        assert "concat(a,b){axis=1}" in session.weights
        got = session.run(feeds)
    assert sorted(over_initializers(made[0])) == ["MatMul", "Mul"]   # and the add over them
    for name, want in run_ort(g, w, feeds).items():
        np.testing.assert_array_equal(got[name].view(np.uint16), want.view(np.uint16), err_msg=name)


@pytest.mark.parametrize("variant", ["basic", "all"])
def test_onnx_runtime_runs_as_many_kernels_folded_or_not(gpt2_steps, on_file, variant):
    """What ``blockc compare`` counts (ONNX Runtime's optimized model) is the
    same: ONNX Runtime folded these nodes itself before."""
    from blockc import files
    from blockc.runtime.backend import make_backend
    (prefill, _), w = gpt2_steps
    backend, counts = make_backend("ort-cpu"), []
    for weights in (w, on_file(w)):
        with backend.compile(prefill, weights, variant=variant, count_kernels=True) as compiled:
            counts.append(compiled.kernels)
    assert files.CACHE_COUNTS["weights", "miss"] == 1 and counts[0] == counts[1]
