"""The generation loop against recomputing the whole sequence every step:
the KV cache, the left padding and the decode graph's positions must change
nothing but the cost."""
import numpy as np
import pytest

from blockc import trace
from blockc.errors import BlockcError
from blockc.frontends import build_model, init_weights
from blockc.generate import generate, greedy
from blockc.generate.loop import Generation, left_pad
from blockc.ir.dtypes import FLOAT_NAMES
from blockc.runtime.backend import make_backend

PROMPTS = [[5, 17, 99, 3, 42, 7], [200, 1, 64]]   # different lengths: the second is left-padded


def weights_of(model, seed=3):
    """Weights at the scale of a trained model's, so greedy picks vary from
    step to step (blockc's 0.02 initialisation with a tied head repeats the
    last token): matrices scaled by their fan-in, norm weights near 1,
    biases near 0. The rotary tables stay as made."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, w in init_weights(model, seed=seed).items():
        if name.startswith("rope."):
            out[name] = w
        elif w.ndim == 2:
            out[name] = (rng.standard_normal(w.shape) / np.sqrt(w.shape[-1])).astype(w.dtype)
        elif "ln" in name or "norm" in name:
            out[name] = (1 + 0.2 * rng.standard_normal(w.shape)).astype(w.dtype) if name.endswith("weight") else \
                (0.1 * rng.standard_normal(w.shape)).astype(w.dtype)
        else:
            out[name] = (0.1 * rng.standard_normal(w.shape)).astype(w.dtype)
    return out


def recompute_greedy(model, weights, prompt, max_new, backend):
    """Greedy decoding without a cache: the plain forward graph on the whole
    sequence, one prompt alone, every step."""
    graph = trace(model)
    takes_positions = any(v.name == "position_ids" for v in graph.inputs)
    tokens = list(prompt)
    with make_backend(backend).compile(graph, weights) as compiled:
        for _ in range(max_new):
            feeds = {"input_ids": np.array([tokens], np.int64)}
            if takes_positions:
                feeds["position_ids"] = np.arange(len(tokens), dtype=np.int64)[None]
            tokens.append(int(np.argmax(compiled.run(feeds)["logits"][0, -1])))
    return tokens[len(prompt):]


@pytest.mark.parametrize("backend", ["reference", "ort-cpu"])
@pytest.mark.parametrize("name", ["tiny", "llama-tiny"])
def test_cached_batch_equals_each_prompt_recomputed(name, backend):
    model = build_model(name)
    weights = weights_of(model)
    got = generate(model, weights, PROMPTS, 8, backend=backend)
    assert got.tokens == [recompute_greedy(model, weights, p, 8, backend) for p in PROMPTS]
    assert len(got.step_s) == 7 and got.first_token_s > 0 and got.tokens_per_s > 0


def test_prefill_and_decode_read_one_copy_of_the_weights(monkeypatch):
    from blockc.runtime import ort_runner
    given, real = [], ort_runner.OrtSession.__init__

    def spy(self, *a, **k):
        real(self, *a, **k)
        given.append({name: w.ctypes.data for name, w in self.weights.items()})   # what ONNX Runtime reads
    monkeypatch.setattr(ort_runner.OrtSession, "__init__", spy)
    model = build_model("llama-tiny")
    generate(model, init_weights(model), PROMPTS, 3, backend="ort-cpu")   # seeded: made on access
    prefill, decode = given
    assert prefill and prefill == decode


@pytest.mark.parametrize("name", ["tiny", "llama-tiny"])
def test_padded_batch_equals_each_prompt_alone(name):
    model = build_model(name)
    weights = weights_of(model, seed=5)
    batch = generate(model, weights, PROMPTS + [[9]], 6).tokens
    assert batch == [generate(model, weights, [p], 6).tokens[0] for p in PROMPTS + [[9]]]


def test_the_graphs_have_a_key_mask_only_where_a_prompt_is_padded(monkeypatch):
    # one prompt, or prompts of one length: no row has a pad, so no key mask to build and apply
    from blockc.frontends.models import DecoderLM
    asked, real = [], DecoderLM.for_cache

    def for_cache(self, mode, cache_len=None, padded=True):
        asked.append((mode, padded))
        return real(self, mode, cache_len, padded)
    monkeypatch.setattr(DecoderLM, "for_cache", for_cache)
    model = build_model("llama-tiny")
    weights = weights_of(model)
    for prompts, padded in (([[5, 17, 99]], False), ([[5, 17, 99], [1, 2, 3]], False), (PROMPTS, True)):
        asked.clear()
        generate(model, weights, prompts, 3)
        assert asked == [("prefill", padded), ("decode", padded)], prompts


def test_cuda_emu_generates_as_reference():
    backend = make_backend("cuda-emu")
    ok, why = backend.availability()
    if not ok:
        pytest.skip(why)
    model = build_model("tiny")
    weights = weights_of(model)
    assert generate(model, weights, PROMPTS, 3, backend="cuda-emu").tokens == \
        generate(model, weights, PROMPTS, 3, backend="reference").tokens


@pytest.mark.parametrize("backend", ["reference", "ort-cpu", "torch-eager", "cuda-emu"])
@pytest.mark.parametrize("dtype", FLOAT_NAMES)
def test_generate_works_for_every_dtype_that_run_does(dtype, backend):
    """Where a backend runs the model in ``dtype``, generating on it gives
    the greedy ids of recomputing the whole sequence on it; where it cannot
    (ONNX Runtime's CPU kernels have no bfloat16), generate refuses as run
    does, in blockc's own words."""
    if not make_backend(backend).availability()[0]:
        pytest.skip(make_backend(backend).availability()[1])
    model = build_model("tiny", {"dtype": dtype, "layers": "1"})
    weights = weights_of(model)
    try:
        expected = recompute_greedy(model, weights, PROMPTS[0], 3, backend)
    except BlockcError as refused:
        with pytest.raises(BlockcError) as caught:
            generate(model, weights, PROMPTS[:1], 3, backend=backend)
        assert type(caught.value) is type(refused)
        return
    assert generate(model, weights, PROMPTS[:1], 3, backend=backend).tokens == [expected]


def test_generate_compiles_the_fused_graphs_unless_told(monkeypatch):
    # the graphs docs/PERFORMANCE.md measures; form= picks another
    import blockc.generate.loop as loop
    asked, real = [], loop.form_of

    def counted(source, make, form, **kw):
        asked.append(form)
        return real(source, make, form, **kw)
    monkeypatch.setattr(loop, "form_of", counted)
    model = build_model("tiny", {"layers": "1"})
    weights = weights_of(model)
    assert generate(model, weights, PROMPTS, 2).form == "fused" and asked == ["fused", "fused"]
    asked.clear()
    assert generate(model, weights, PROMPTS, 2, form="standard").form == "standard" and asked == ["standard"] * 2


def test_fused_graphs_generate_the_same():
    model = build_model("llama-tiny")
    weights = weights_of(model)
    assert generate(model, weights, PROMPTS, 5, form="fused").tokens == \
        generate(model, weights, PROMPTS, 5, form="standard").tokens


def test_stop_id_ends_a_row_and_pick_sees_the_history():
    model = build_model("tiny")
    weights = weights_of(model)
    free = generate(model, weights, PROMPTS, 6).tokens
    stop = free[0][2]
    seen = []

    def pick(logits, history):
        seen.append([list(h) for h in history])
        return greedy(logits, history)

    got = generate(model, weights, PROMPTS, 6, stop_id=stop, pick=pick)
    assert got.tokens[0] == free[0][:free[0].index(stop) + 1]   # the stop id is kept, nothing after it
    assert seen[0] == PROMPTS and seen[1] == [p + t[:1] for p, t in zip(PROMPTS, got.tokens)]


def test_left_pad_follows_hugging_face():
    ids, mask, positions = left_pad([[4, 5, 6], [7]])
    np.testing.assert_array_equal(ids, [[4, 5, 6], [0, 0, 7]])
    np.testing.assert_array_equal(mask, [[1, 1, 1], [0, 0, 1]])
    np.testing.assert_array_equal(positions, [[0, 1, 2], [0, 0, 0]])


@pytest.mark.parametrize("prompts, max_new, message", [
    ([[1, 2], []], 4, "prompt 1 is empty"),
    ([], 4, "no prompts"),
    ([[1, 256]], 4, r"prompt 0: token id 256 is outside the vocabulary \[0, 256\)"),
    ([[-1]], 4, "token id -1 is outside"),
    ([[1] * 120], 9, "a prompt of 120 tokens and 9 new ones make 129 positions, over the model's maximum of 128"),
    ([[1]], 0, "max_new must be a positive integer, got 0"),
])
def test_bad_requests_are_refused(prompts, max_new, message):
    model = build_model("tiny")
    with pytest.raises(BlockcError, match=message):
        generate(model, weights_of(model), prompts, max_new)


SAME_PROMPTS = [np.array([[5, 17, 99], [200, 1, 64]]),                       # numpy's ambiguous truth value once
                (np.array([5, 17, 99], np.int32), np.array([200, 1, 64], np.uint8)),
                [[np.int64(5), 17, 99], (200, 1, 64)]]


@pytest.mark.parametrize("prompts", SAME_PROMPTS, ids=["2-D array", "1-D arrays", "numpy ints, a tuple"])
def test_any_integer_sequence_or_array_is_a_prompt(prompts):
    model = build_model("tiny", {"layers": "1"})
    weights = weights_of(model)
    want = generate(model, weights, [[5, 17, 99], [200, 1, 64]], 3, backend="reference").tokens
    assert generate(model, weights, prompts, 3, backend="reference").tokens == want


@pytest.mark.parametrize("prompts, message", [
    ([[1.0, 2.5]], "prompt 0: token id 1.0 is a float; token ids are integers"),   # once "outside the vocabulary"
    (np.array([[1.0, 2.0]]), "prompt 0: token id 1.0 is a float; token ids are integers"),
    ([[1], [2, np.float32(3)]], "prompt 1: token id 3.0 is a float; token ids are integers"),
    ([[True, 2]], "prompt 0: token id True is a bool; token ids are integers"),
    ([["1"]], "prompt 0: token id '1' is a str; token ids are integers"),
    ([1, 2], r"prompt 0 must be a sequence of token ids, got 1 \(prompts is a list of prompts: wrap one"),
    (np.array([1, 2]), r"prompts must be a 2-D array of token ids, one prompt a row, got shape \[2\]"),
    ("12", "prompts must be a list of prompts, each a sequence of token ids, got str"),
])
def test_prompts_that_are_not_integers_are_refused_as_what_they_are(prompts, message):
    model = build_model("tiny")
    with pytest.raises(BlockcError, match=message):
        generate(model, {}, prompts, 2)


def test_only_decoder_lms_generate():
    model = build_model("bert-base", {"layers": "1", "d_model": "32", "heads": "2"})
    with pytest.raises(BlockcError, match="generate needs a decoder language model"):
        generate(model, {}, [[1]], 2)


def test_a_bad_pick_is_refused():
    model = build_model("tiny")
    with pytest.raises(BlockcError, match="pick returned"):
        generate(model, weights_of(model), [[1]], 2, pick=lambda logits, history: np.array([0.5]))


@pytest.mark.parametrize("prompts, decode_prepacks", [([[5, 17, 99]], False), ([[5, 17, 99], [3, 4, 5]], True)])
def test_prefill_and_decode_read_one_copy_of_the_weights_file(tmp_path, monkeypatch, prompts, decode_prepacks):
    """Both sessions declare every weight at the same place in the .safetensors
    file, which ONNX Runtime maps: one copy in memory, the OS's page cache,
    for both; the QKV and gate/up merges come folded, from one file in the
    cache, the same for both (``runtime/folded_params.py``). A decode step
    of one prompt multiplies one row by each weight, so its session keeps
    them as they are (no prepacked copy); with more rows it repacks them.
    The prefill runs once, so its session never repacks them: its one
    product packs each weight as it goes (``CompileHints.packs_weights``)."""
    import onnx
    import onnxruntime as ort

    from blockc import files
    from blockc.frontends.weights import load_weights, save_weights
    monkeypatch.setenv("BLOCKC_CACHE", str(tmp_path / "cache"))
    # the clock 10 s on: the file written just now is not racy, and its merges are folded (files.racy)
    monkeypatch.setattr(files, "_now_ns", lambda: files.time.time_ns() + 10 * 10**9)
    made, real = [], ort.InferenceSession

    def spy(model, options, **kw):
        try:
            unpacked = options.get_session_config_entry("session.disable_prepacking") == "1"
        except Exception:   # no such entry: ONNX Runtime's default, prepacking
            unpacked = False
        made.append((onnx.load_from_string(model), unpacked))
        return real(model, options, **kw)
    monkeypatch.setattr(ort, "InferenceSession", spy)
    model = build_model("llama-tiny", {"layers": "1"})
    save_weights(tmp_path / "w.safetensors", weights_of(model))
    weights = load_weights(tmp_path / "w.safetensors")
    got = generate(model, weights, prompts, 3)
    assert got.tokens == generate(model, {k: np.array(a) for k, a in weights.items()}, prompts, 3).tokens
    (prefill, prefill_unpacked), (decode, decode_unpacked) = made[:2]   # the file-backed generation's
    places = [{t.name: [(e.key, e.value) for e in t.external_data] for t in m.graph.initializer
               if t.external_data} for m in (prefill, decode)]
    assert places[0] == places[1]
    merged = {"w_q", "w_k", "w_v", "gate", "up"}
    assert set(places[0]) & set(weights) == {name for name in weights if name.split(".")[-2] not in merged}
    assert all(dict(p)["location"] == "w.safetensors" for name, p in places[0].items() if name in weights)
    assert sorted(name.split("(")[0] for name in places[0] if name not in weights) == ["concat", "concat"]
    assert {tuple(dict(p)["location"].split("/")[:2]) for name, p in places[0].items() if name not in weights} \
        == {("cache", "weights")}
    assert (prefill_unpacked, decode_unpacked) == (True, not decode_prepacks)


@pytest.mark.parametrize("steps", [[0.5], [0.25, 0.5], [3.0, 1.0, 2.0, 7.5, 0.5], [float(k % 7) for k in range(23)]])
def test_the_p90_step_is_numpys_percentile(steps):
    """Computed without numpy's percentile (which imports numpy.ma at the run's end), to the same value."""
    assert Generation([[1]], 0.1, steps).step_p90_s == pytest.approx(float(np.percentile(steps, 90)), abs=1e-12)
