"""A decode step's KV cache kept in place through the generated C API: the
caller passes each layer's cache buffer as both its past input and its
present output, and ``cache_write`` (kernels/copy.py) then skips its copy of
the cache and writes only the step's rows. Emulated: the same numbers as
with separate buffers (bit for bit, and the float64 reference), the step's
rows where they belong, and one launch fewer per cache."""
from __future__ import annotations

import numpy as np
import pytest

import blockc
from blockc.codegen.cuda import toolchain
from blockc.codegen.cuda.lower import generate
from blockc.errors import BlockcError
from blockc.generate.loop import cache_names

pytestmark = pytest.mark.skipif(toolchain.find_gxx() is None, reason="no g++: the CUDA emulator needs one")
CACHE_LEN = 40


@pytest.fixture(scope="module")
def step():
    from blockc.runtime.cuda_runner import emulated_library
    model = blockc.build_model("llama-tiny")
    decode = model.for_cache("decode", cache_len=CACHE_LEN)
    graph = blockc.to_form(blockc.trace(decode), "fused")
    weights = dict(blockc.init_weights(model))
    cm = generate(graph, weights)
    return model, decode, graph, weights, cm, emulated_library(cm)


def feeds_at(model, decode, total: int, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    f = {spec.name: spec.sample({"batch": 2, "total": total}, rng) for spec in decode.inputs()}
    f["attention_mask"] = np.ones((2, total), np.int64)
    f["position_ids"] = np.full((2, 1), total - 1, np.int64)
    for past, _ in cache_names(model.cfg.layers):
        f[past][:, :, total - 1:] = 0   # rows at and after this step's are not written yet
    return f


def test_the_cache_write_is_lowered_not_decomposed(step):
    *_, cm, _ = step
    writes = [s.name for s in cm.steps if s.ops == ["cache_write"]]
    # keys and values of 2 layers, each the whole copy (skipped in place) and the rows; no slices and concat
    assert [n.split("_")[0] for n in writes] == ["copy", "cache"] * 4, writes


def test_a_cache_passed_as_its_own_present_is_written_in_place(step):
    from blockc.runtime.cuda_runner import run_model
    model, decode, graph, weights, cm, so = step
    f = feeds_at(model, decode, total=25)
    pairs = {present: past for past, present in cache_names(model.cfg.layers)}
    apart = run_model(cm, so, f, emulated=True)
    shared = run_model(cm, so, f, emulated=True, in_place=pairs)
    assert shared.counters["kernel_launches"] == apart.counters["kernel_launches"] - len(pairs)
    ref = blockc.run_reference(graph, weights, f)
    for name, y in apart.outputs.items():
        np.testing.assert_array_equal(shared.outputs[name], y)
        np.testing.assert_allclose(y, ref[name], rtol=1e-4, atol=1e-5)
    for present, past in pairs.items():
        cache = shared.outputs[present]
        np.testing.assert_array_equal(cache[:, :, :24], f[past][:, :, :24])   # the past, untouched
        np.testing.assert_array_equal(cache[:, :, 25:], 0)                     # nothing past the step's row
        assert np.abs(cache[:, :, 24]).max() > 0                                # the step's row, written


def test_in_place_needs_an_input_of_the_same_type(step):
    from blockc.runtime.cuda_runner import run_model
    model, decode, _, _, cm, so = step
    f = feeds_at(model, decode, total=25)
    with pytest.raises(BlockcError, match="not an input"):
        run_model(cm, so, f, emulated=True, in_place={"present.0.key": "nope"})
    with pytest.raises(BlockcError, match="its own type"):
        run_model(cm, so, f, emulated=True, in_place={"logits": "past.0.key"})


@pytest.mark.skipif(toolchain.find_nvcc().path is None, reason="no nvcc")
def test_the_decode_step_compiles_for_the_gpu_without_warnings_or_spills(tmp_path):
    """The whole llama-tiny decode step as a GPU build (cuBLASLt): the
    in-place cache write, the decode split of attention and the host code
    around them, for sm_80 and sm_90 with warnings as errors."""
    from blockc.codegen.cuda import build as cuda_build
    try:
        toolchain.find_cublas()
    except toolchain.ToolchainError as e:
        pytest.skip(str(e))
    model = blockc.build_model("llama-tiny")
    graph = blockc.to_form(blockc.trace(model.for_cache("decode", cache_len=CACHE_LEN)), "fused")
    cm = generate(graph, dict(blockc.init_weights(model)), gemm="cublas")
    cuda_build.write_build(cm, str(tmp_path))
    result = toolchain.compile_nvcc(str(tmp_path / "model.cu"), ["sm_80", "sm_90"], werror=True,
                                    extra_flags=[f"-I{tmp_path}"] + cuda_build.library_flags(cm.gemm, link=False))
    names = {k.short_name for k in result.kernels}
    assert any(n.startswith("cache_rows") for n in names) and any(n.endswith("_decode_split") for n in names)
    assert all(k.spill_store_bytes == 0 and k.spill_load_bytes == 0 for k in result.kernels), \
        [(k.short_name, k.arch) for k in result.kernels if k.spill_store_bytes or k.spill_load_bytes]
