"""A step on the generated CUDA run again and again with its KV cache kept on
the device (``cuda_runner.CudaSession``, ``CudaCompiled.cached``): one child
process for every step, each layer's cache one device buffer bound as its
past and its present, so ``cache_write`` writes only the step's rows.
Emulated: the same tokens as the reference, the same cache, a buffer that
never moves, the cache's copy never launched, and a failing run reported."""
from __future__ import annotations

import numpy as np
import pytest

import blockc
from blockc.codegen.cuda import toolchain
from blockc.generate.loop import cache_names, generate, into_cache
from blockc.runtime.backend import make_backend
from blockc.runtime.cuda_runner import CudaRunError

pytestmark = pytest.mark.skipif(toolchain.find_gxx() is None, reason="no g++: the CUDA emulator needs one")
CACHE_LEN = 40   # test_cache_in_place's decode step: one build of it in the suite's cache


@pytest.fixture(scope="module")
def llama():
    model = blockc.build_model("llama-tiny")
    return model, dict(blockc.init_weights(model))


def test_generate_on_cuda_emu_keeps_its_cache_in_place_and_matches_the_reference(llama):
    model, weights = llama
    prompts = [[1, 2, 3], [4, 5]]
    want = generate(model, weights, prompts, 6, backend="reference", form="fused")
    got = generate(model, weights, prompts, 6, backend="cuda-emu", form="fused")
    assert got.tokens == want.tokens


def test_a_cached_step_never_moves_or_copies_its_cache(llama):
    model, weights = llama
    decode = blockc.to_form(blockc.trace(model.for_cache("decode", cache_len=CACHE_LEN)), "fused")
    rng = np.random.default_rng(0)
    names = cache_names(model.cfg.layers)
    state = {past: into_cache(rng.standard_normal((1, 2, 4, 16)).astype(np.float32), CACHE_LEN)
             for past, _ in names}
    carry = {present: past for past, present in names}
    steps = []
    for backend in ("reference", "cuda-emu"):
        with make_backend(backend).compile(decode, weights) as compiled, \
                compiled.cached(carry, dict(state)) as step:
            seen = []
            for total in (5, 6, 7):
                out = step.run({"input_ids": np.array([[total]]), "attention_mask": np.ones((1, total), np.int64),
                                "position_ids": np.array([[total - 1]])})
                seen.append((out["logits"], step.address("past.0.key"), getattr(step, "counters", {})))
            steps.append((seen, {past: step.value(past) for past, _ in names}))
    (ref_steps, ref_cache), (cuda_steps, cuda_cache) = steps
    for (ref_logits, *_), (logits, *_) in zip(ref_steps, cuda_steps):
        np.testing.assert_allclose(logits, ref_logits, rtol=1e-4, atol=1e-5)
    for past in ref_cache:
        np.testing.assert_allclose(cuda_cache[past], ref_cache[past], rtol=1e-5, atol=1e-6)
        assert np.abs(cuda_cache[past][:, :, 4:7]).max() > 0 and not cuda_cache[past][:, :, 7:].any()
    assert len({address for _, address, _ in cuda_steps}) == 1   # one buffer, every step
    # each step launches the same kernels, never a copy of any of the 4 caches
    launches = {counters["kernel_launches"] for *_, counters in cuda_steps}
    assert len(launches) == 1
    with make_backend("cuda-emu").compile(decode, weights) as compiled:
        apart = compiled._launch({**{"input_ids": np.array([[7]]), "attention_mask": np.ones((1, 7), np.int64),
                                     "position_ids": np.array([[6]])}, **state},
                                 compiled.check({"input_ids": np.array([[7]]),
                                                 "attention_mask": np.ones((1, 7), np.int64),
                                                 "position_ids": np.array([[6]]), **state}))
    assert launches == {apart.counters["kernel_launches"] - len(names)}


def test_a_failing_step_is_reported_and_the_session_goes_on(llama):
    model, weights = llama
    decode = blockc.to_form(blockc.trace(model.for_cache("decode", cache_len=CACHE_LEN)), "fused")
    names = cache_names(model.cfg.layers)
    state = {past: np.zeros((1, 2, CACHE_LEN, 16), np.float32) for past, _ in names}
    with make_backend("cuda-emu").compile(decode, weights) as compiled, \
            compiled.cached({present: past for past, present in names}, state) as step:
        feeds = {"input_ids": np.array([[3]]), "attention_mask": np.ones((1, 2), np.int64),
                 "position_ids": np.array([[1]])}
        first = step.run(feeds)["logits"]
        # a position past the rotary table passes Python's checks only if they are skipped: the C API refuses it
        session = step._session
        with pytest.raises(CudaRunError, match="blockc_run"):
            session.run({**feeds, "position_ids": np.array([[500]])}, {"batch": 1, "total": 2})
        np.testing.assert_array_equal(step.run(feeds)["logits"], first)
