"""The row kernels (codegen/cuda/kernels/rows.py): LayerNorm/RMSNorm with and
without the residual and its sum, softmax, and masked causal softmax, run
emulated against the float64 reference at lengths that reach every tier
(each register group and pack count, the shared-memory cache below and above
the 48 KiB default, the block-a-row fallback) and their edges, in float32,
float16 and bfloat16, at static and symbolic lengths; what a causal query
cannot see never read (AddressSanitizer on the masked triangle); and every
variant compiled by nvcc for sm_80/sm_90, warnings as errors, without spills."""
from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

import blockc
from blockc.codegen.cuda import build as cuda_build
from blockc.codegen.cuda import toolchain
from blockc.codegen.cuda.kernels.rows import REGISTER_TIERS, register_tiers
from blockc.codegen.cuda.lower import generate
from blockc.ir.dtypes import DType
from blockc.runtime.backend import make_backend

needs_gxx = pytest.mark.skipif(toolchain.find_gxx() is None, reason="no g++: the CUDA emulator needs one")
NVCC = toolchain.find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC.path is None, reason=f"{NVCC.reason}")

DTYPES = {"f32": DType.float32, "f16": DType.float16, "bf16": DType.bfloat16}
NUMPY = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}

# Each register tier's edges in float32 (4 a vector) and 16-bit types (8), the
# shared-memory cache below 48 KiB (10000 floats) and above it (20000: only
# with the attribute raised), and past the emulated device's 227 KiB (60000).
LENGTHS = [1, 7, 10, 16, 33, 50, 100, 200, 513, 1000, 1023, 1025, 1028, 2049, 2056, 4097, 10000, 20000, 60000]
CACHE_LIMIT = 232448   # cudaDevAttrMaxSharedMemoryPerBlockOptin, as the emulator reports an H100's


def tier(cols: int, t: str) -> tuple | str:
    """Which kernel the launcher runs for a row of ``cols``: a register tier
    (lanes, vectors a lane), else the shared-memory cache where its 35 + cols
    floats (blockc_row_cache_bytes) fit, else the block-a-row kernel."""
    warp, _ = register_tiers(cols, DTYPES[t])
    if warp:
        return warp[0]
    return "smem" if (35 + cols) * 4 <= CACHE_LIMIT else "block"


@pytest.mark.parametrize("t", DTYPES)
def test_the_lengths_reach_every_tier(t):
    assert {tier(n, t) for n in LENGTHS} == set(REGISTER_TIERS) | {"smem", "block"}


def test_a_static_length_generates_only_its_tier():
    assert register_tiers(1025, DType.float32) == ([(32, 8)], False)     # 256 vectors, head and tail aside
    assert register_tiers(1028, DType.float32) == ([], True)
    assert register_tiers(7, DType.float16) == ([(1, 1)], False)         # no whole vector: all edges, one lane
    assert register_tiers(2055, DType.bfloat16) == ([(32, 8)], False)


def spacing(ref: np.ndarray, np_t) -> np.ndarray:
    """The distance between neighbouring values of ``np_t`` at ``ref``."""
    info = ml_dtypes.finfo(np_t)
    return np.exp2(np.floor(np.log2(np.maximum(np.abs(ref), float(info.tiny))))) * float(info.eps)


def assert_close(out: np.ndarray, ref: np.ndarray, t: str, what: str, ulps: float = 2) -> None:
    """float32: a few float32 roundings of float64. 16-bit types: float32
    math rounded once, so within ``ulps`` units of the last place of the
    float64 result, plus float32's own error on the terms (it matters only
    where the result is tiny next to them)."""
    out = out.astype(np.float64)
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    if t == "f32":
        bound = 1e-5 * np.abs(ref) + 1e-6 * scale
    else:
        bound = ulps * spacing(ref, NUMPY[t]) + 1e-6 * scale
    bad = np.abs(out - ref) > bound
    assert not bad.any(), (what, int(bad.sum()), np.argwhere(bad)[:3].tolist(),
                           out[bad][:3].tolist(), ref[bad][:3].tolist())


def rows_graph(t: str, n: str) -> str:
    """Every row op over rows of length ``n`` (a number or a symbol): norms of
    ``[b, 5, n]`` with a residual ``[5, n]`` that repeats every 5 rows (so its
    rows lie differently from x's wherever 5 * n is not a whole number of
    vectors), softmax, a causal softmax with a padding mask over ``q``
    queries (``q`` may exceed ``n``: queries that see nothing), and one with
    an additive mask and no causal mask."""
    inputs = (f"%x: {t}[b,5,{n}], %r: {t}[5,{n}], %g: {t}[{n}], %bias: {t}[{n}], %s: {t}[b,2,q,{n}], "
              f"%keep: bool[b,1,1,{n}], %add: {t}[1,1,q,{n}]")
    return f"""graph rows_{t}({inputs}) {{
  %ln:{t}[b,5,{n}] = layernorm %x, %g, %bias {{eps=1e-05}}
  %rms:{t}[b,5,{n}] = rmsnorm %x, %g {{eps=1e-05}}
  %aln:{t}[b,5,{n}], %sum:{t}[b,5,{n}] = add_layernorm %x, %r, %g, %bias {{eps=1e-05, with_sum=true}}
  %arms:{t}[b,5,{n}] = add_rmsnorm %x, %r, %g {{eps=1e-05}}
  %sm:{t}[b,5,{n}] = softmax %x {{axis=-1}}
  %msm:{t}[b,2,q,{n}] = masked_softmax %s, %keep {{scale=0.25, mask="bool", causal=true, fill=-30000.0}}
  %msa:{t}[b,2,q,{n}] = masked_softmax %s, %add {{scale=0.25, mask="additive"}}
  return ln=%ln, rms=%rms, aln=%aln, sum=%sum, arms=%arms, sm=%sm, msm=%msm, msa=%msa
}}
"""
OUTPUTS = ("ln", "rms", "aln", "sum", "arms", "sm", "msm", "msa")


def feeds_for(t: str, b: int, q: int, n: int, seed: int) -> dict:
    np_t, rng = NUMPY[t], np.random.default_rng(seed)
    keep = rng.random((b, 1, 1, n)) > 0.2
    keep[..., 0] = True
    return {"x": (rng.standard_normal((b, 5, n)) + 0.5).astype(np_t), "r": rng.standard_normal((5, n)).astype(np_t),
            "g": (1 + rng.standard_normal(n) / 4).astype(np_t), "bias": rng.standard_normal(n).astype(np_t),
            "s": (4 * rng.standard_normal((b, 2, q, n))).astype(np_t), "keep": keep,
            "add": (-4 * rng.random((1, 1, q, n))).astype(np_t)}


def shape_for(n: int) -> tuple[int, int]:
    """Batches and queries: many rows where rows are short (groups of lanes,
    part-filled warps and blocks), a square causal mask where that is small,
    and queries past the keys for the shortest rows. Past 1025 a row is a
    warp's or a block's alone, so more rows only repeat it: 2 batches (the
    residual still repeats) and 8 queries, whose last visible keys cut the
    vector at each of its phases (8 halves, 4 floats), as 40 did; the
    emulated runs at those lengths were most of the runs' time."""
    b = 30 if n <= 100 else 4 if n <= 1025 else 2
    q = n + 5 if n <= 10 else min(n, 40) if n <= 1025 else 8
    return b, q


def check(out: dict, ref: dict, t: str, where: str) -> None:
    for k in ref:
        assert out[k].dtype == NUMPY[t] and out[k].shape == ref[k].shape
        # x + residual is exact in float32: the sum output is that, rounded once
        assert_close(out[k], ref[k], t, f"{k} at {where}", ulps=0.5 if k == "sum" else 2)


@needs_gxx
@pytest.mark.parametrize("t", DTYPES)
def test_symbolic_length_matches_the_reference_in_every_tier(t):
    """One build whose launchers pick the tier at run time, run at every length."""
    graph = blockc.parse_graph(rows_graph(t, "n"))
    with make_backend("cuda-emu").compile(graph, {}) as compiled:
        for i, n in enumerate(LENGTHS):
            b, q = shape_for(n)
            feeds = feeds_for(t, b, q, n, seed=i)
            check(compiled.run(feeds), blockc.run_reference(graph, {}, feeds), t, f"n={n} ({tier(n, t)})")


@needs_gxx
@pytest.mark.parametrize("t", DTYPES)
def test_static_lengths_match_the_reference_in_every_tier(t):
    """A static length generates only its own tier (a kernel of one
    instantiation, or the two block-a-row kernels): every length's ops in one build."""
    ops, feeds = [], {}
    for i, n in enumerate(LENGTHS):
        b, q = shape_for(n)
        body = rows_graph(t, str(n)).split("{\n", 1)[1].rsplit("  return", 1)[0]
        ops.append(body.replace("%", f"%n{n}_").replace("[b,", f"[{b},").replace(",q,", f",{q},"))
        feeds.update({f"n{n}_{k}": v for k, v in feeds_for(t, b, q, n, seed=i).items()})
    inputs = ", ".join(f"%{k}: {'bool' if v.dtype == bool else t}[{','.join(map(str, v.shape))}]"
                       for k, v in feeds.items())
    outputs = ", ".join(f"n{n}_{k}=%n{n}_{k}" for n in LENGTHS for k in OUTPUTS)
    graph = blockc.parse_graph(f"graph static_{t}({inputs}) {{\n" + "".join(ops) + f"  return {outputs}\n}}\n")
    for code in generate(graph, {}).steps:
        n = int(re.search(r"_(\d+)(_|$)", code.name).group(1))   # rows.shape_class: the static length
        want = ["smem", "block"] if isinstance(tier(n, t), str) else ["warp"]
        assert [k.rsplit("_", 1)[1] for k in code.kernels] == want, code.name
        assert ("template <int G" in code.source) == (want == ["warp"])
    out = make_backend("cuda-emu").run(graph, {}, feeds)
    ref = blockc.run_reference(graph, {}, feeds)
    for n in LENGTHS:
        check({k: out[f"n{n}_{k}"] for k in OUTPUTS}, {k: ref[f"n{n}_{k}"] for k in OUTPUTS}, t, f"n={n} ({tier(n, t)})")


# ---- rows that start anywhere, and the scores a causal query cannot see -------------------------
# The model's own entry (blockc_entry), with every input and output moved some
# bytes into its buffer, so that x, the residual, gamma, beta and each output
# lie at different phases of 16 bytes; and with the scores (and the additive
# mask entries) that no causal query sees poisoned for AddressSanitizer.
HARNESS = r"""
#include <sanitizer/asan_interface.h>

// The columns past query (r % q_len)'s last visible key, less `reach`, in each row r.
static void poison_unseen(char* buf, long long rows, long long q_len, long long cols, long long reach, bool on) {
  for (long long r = 0; r < rows; ++r) {
    long long first = r % q_len + (cols - q_len) + 1 - reach;
    if (first < 0) first = 0;
    if (first >= cols) continue;
    char* p = buf + (r * cols + first) * kElem;
    const size_t n = (size_t)((cols - first) * kElem);
    if (on) {
      ASAN_POISON_MEMORY_REGION(p, n);
    } else {
      ASAN_UNPOISON_MEMORY_REGION(p, n);
    }
  }
}

// ints: the model's own (dims, weights size), then reach (-1: nothing poisoned), q_len, cols,
// and a shift in bytes for each input and output.
extern "C" int run_rows(void** buffers, const long long* ints) {
  const long long* mine = ints + kNumSymbols + 1;
  const long long reach = mine[0], q_len = mine[1], cols = mine[2];
  void* moved[1 + kNumInputs + kNumOutputs];
  moved[0] = buffers[0];
  for (int i = 1; i < 1 + kNumInputs + kNumOutputs; ++i) moved[i] = (char*)buffers[i] + mine[2 + i];
  char* scores = (char*)moved[1 + kScores];
  char* mask = (char*)moved[1 + kMask];
  if (reach >= 0) {
    poison_unseen(scores, kHeads * q_len, q_len, cols, reach, true);
    poison_unseen(mask, q_len, q_len, cols, reach, true);
  }
  const int rc = blockc_entry(moved, ints);
  if (reach >= 0) {
    poison_unseen(scores, kHeads * q_len, q_len, cols, reach, false);
    poison_unseen(mask, q_len, q_len, cols, reach, false);
  }
  return rc;
}
"""

SHIFTED = ("graph shifted_{t}(%x: {t}[2,5,n], %r: {t}[5,n], %g: {t}[n], %bias: {t}[n], %s: {t}[1,2,q,n], "
           "%m: {t}[1,1,q,n]) {{\n") + """  %aln:{t}[2,5,n], %sum:{t}[2,5,n] = add_layernorm %x, %r, %g, %bias {{eps=1e-05, with_sum=true}}
  %sm:{t}[2,5,n] = softmax %x {{axis=-1}}
  %msm:{t}[1,2,q,n] = masked_softmax %s, %m {{scale=0.25, mask="additive", causal=true, fill=-30000.0}}
  return aln=%aln, sum=%sum, sm=%sm, msm=%msm
}}
"""
# (n, q): a group (queries past the keys), a warp of 1 and of 8 vectors a
# lane, the shared-memory cache, the block-a-row kernel. 8 queries: their last
# visible keys cut a vector at each of its phases; more only add rows, which
# under AddressSanitizer run one OS thread a CUDA thread.
SHIFTED_RUNS = [(10, 15), (50, 40), (1025, 40), (2100, 8), (60000, 3)]
SHIFTS = {"x": 1, "r": 0, "g": 2, "bias": 3, "s": 1, "m": 2, "aln": 0, "sum": 3, "sm": 2, "msm": 1}  # elements


def asan_harness(t: str, tmp_path):
    """SHIFTED's model with HARNESS's entry, built with AddressSanitizer."""
    from blockc.runtime.cuda_runner import linked_sanitizer
    try:
        toolchain.sanitizer_runtime("address")
    except toolchain.ToolchainError as e:
        pytest.skip(str(e))
    graph = blockc.parse_graph(SHIFTED.format(t=t))
    cm = generate(graph, {})
    names = [name for name, _ in cm.inputs]
    cuda_build.write_build(cm, str(tmp_path))
    source = tmp_path / "harness.cu"
    constants = (f"static const int kScores = {names.index('s')}, kMask = {names.index('m')};\n"
                 f"static const long long kHeads = 2, kElem = {DTYPES[t].itemsize};\n")
    source.write_text((tmp_path / "model.cu").read_text() + constants + HARNESS)
    lib = toolchain.compile_emulated([source], tmp_path / "harness.so", sanitize="address",
                                     extra_flags=["-DBLOCKC_EMULATE", f"-I{tmp_path}"])
    assert linked_sanitizer(lib) == "address"
    return graph, cm, lib


def run_shifted(graph, cm, lib, t: str, n: int, q: int, reach: int) -> dict:
    from blockc.runtime.cuda_runner import run_emulated
    np_t, rng = NUMPY[t], np.random.default_rng(n)
    feeds = {"x": rng.standard_normal((2, 5, n)), "r": rng.standard_normal((5, n)),
             "g": 1 + rng.standard_normal(n) / 4, "bias": rng.standard_normal(n),
             "s": 4 * rng.standard_normal((1, 2, q, n)), "m": -rng.random((1, 1, q, n))}
    feeds = {k: v.astype(np_t) for k, v in feeds.items()}
    bindings = {"n": n, "q": q}
    item = DTYPES[t].itemsize

    def moved(name, array):
        raw = np.zeros(array.nbytes + 16, np.uint8)
        raw[SHIFTS[name] * item:][:array.nbytes] = array.reshape(-1).view(np.uint8)
        return raw
    outs = {name: np.zeros(tuple(bindings.get(str(d), d) for d in v.shape), np_t) for name, v in cm.outputs}
    args = [np.frombuffer(cuda_build.weights_blob(cm.params), np.uint8).copy()]
    args += [moved(name, feeds[name]) for name, _ in cm.inputs] + [moved(name, outs[name]) for name in outs]
    ints = [bindings[s] for s in cm.symbols] + [len(args[0]), reach, q, n]
    ints += [SHIFTS[name] * item for name, _ in cm.inputs] + [SHIFTS[name] * item for name in outs]
    results = run_emulated(lib, "run_rows", args + ints, timeout=600)[1 + len(cm.inputs):]
    got = {name: raw[SHIFTS[name] * item:][:a.nbytes].view(np_t).reshape(a.shape)
           for (name, a), raw in zip(outs.items(), results)}
    check(got, blockc.run_reference(graph, {}, feeds), t, f"n={n} ({tier(n, t)})")
    return got


@needs_gxx
@pytest.mark.parametrize("t", ["f32", "f16"])
def test_rows_at_any_phase_read_no_score_a_causal_query_cannot_see(t, tmp_path):
    """Under AddressSanitizer: every tier at odd lengths with each operand at
    its own phase matches the reference while every score (and mask entry) a
    causal query cannot see is poisoned; poisoning one column more, the last
    one the query does see, is reported, so the poisoning is where it says."""
    from blockc.runtime.cuda_runner import CudaRunCrash
    graph, cm, lib = asan_harness(t, tmp_path)
    for n, q in SHIFTED_RUNS:
        run_shifted(graph, cm, lib, t, n, q, reach=0)
    for n, q in SHIFTED_RUNS[:1] + SHIFTED_RUNS[3:4]:
        # ASan names a read of a poisoned half "use-after-poison", or "unknown-crash" where the
        # poisoned bytes end inside an 8-byte shadow granule (it depends on the buffer's alignment)
        with pytest.raises(CudaRunCrash, match="use-after-poison|unknown-crash"):
            run_shifted(graph, cm, lib, t, n, q, reach=1)


# ---- nvcc ----------------------------------------------------------------------------------------
def every_variant() -> str:
    """Every row op in every dtype at a symbolic length (so every tier), the
    masks of both kinds with and without the causal mask, and static lengths
    of one register tier and of the block-a-row tiers."""
    inputs, ops, outputs = ["%keep: bool[2,1,1,n]"], [], []
    for t in DTYPES:
        inputs += [f"%{t}x: {t}[r,n]", f"%{t}res: {t}[r,n]", f"%{t}g: {t}[n]", f"%{t}b: {t}[n]",
                   f"%{t}s: {t}[2,2,q,n]", f"%{t}add: {t}[2,1,q,n]"]
        ops += [f"%{t}0:{t}[r,n] = layernorm %{t}x, %{t}g, %{t}b {{eps=1e-05}}",
                f"%{t}1:{t}[r,n] = rmsnorm %{t}x, %{t}g {{eps=1e-05}}",
                f"%{t}2:{t}[r,n], %{t}3:{t}[r,n] = add_layernorm %{t}x, %{t}res, %{t}g, %{t}b {{eps=1e-05, with_sum=true}}",
                f"%{t}4:{t}[r,n], %{t}5:{t}[r,n] = add_rmsnorm %{t}x, %{t}res, %{t}g {{eps=1e-05, with_sum=true}}",
                f"%{t}6:{t}[r,n] = add_rmsnorm %{t}x, %{t}res, %{t}g {{eps=1e-05}}",
                f"%{t}7:{t}[r,n] = softmax %{t}x {{axis=-1}}",
                f'%{t}8:{t}[2,2,q,n] = masked_softmax %{t}s, %keep {{scale=0.125, mask="bool", causal=true, fill=-1e4}}',
                f'%{t}9:{t}[2,2,q,n] = masked_softmax %{t}s, %{t}add {{scale=0.125, mask="additive", causal=true, fill=-1e4}}',
                f'%{t}10:{t}[2,2,q,n] = masked_softmax %{t}s, %keep {{scale=0.125, mask="bool", fill=-1e4}}',
                f'%{t}11:{t}[2,2,q,n] = masked_softmax %{t}s, %{t}add {{scale=0.125, mask="additive"}}',
                f"%{t}12:{t}[r,n] = neg %{t}0"]   # an intermediate buffer, so the host code has an arena
        outputs += [f"{t}{i}=%{t}{i}" for i in range(1, 13)]
        for n in (100, 5000):
            inputs += [f"%{t}x{n}: {t}[r,{n}]", f"%{t}g{n}: {t}[{n}]", f"%{t}s{n}: {t}[2,2,q,{n}]"]
            ops += [f"%{t}ln{n}:{t}[r,{n}], %{t}sum{n}:{t}[r,{n}] = add_layernorm %{t}x{n}, %{t}x{n}, %{t}g{n}, "
                    f"%{t}g{n} {{eps=1e-05, with_sum=true}}",
                    f'%{t}sm{n}:{t}[2,2,q,{n}] = masked_softmax %{t}s{n} {{scale=0.125, mask="none", causal=true}}']
            outputs += [f"{t}ln{n}=%{t}ln{n}", f"{t}sum{n}=%{t}sum{n}", f"{t}sm{n}=%{t}sm{n}"]
    return (f"graph every_row_kernel({', '.join(inputs)}) {{\n  " + "\n  ".join(ops)
            + f"\n  return {', '.join(outputs)}\n}}\n")


@pytest.fixture(scope="module")
def every_variant_build(tmp_path_factory, nvcc_keeping_ptx):
    """every_variant() generated, and its one nvcc build for sm_80 and sm_90:
    ptxas's report and each arch's PTX (the nvcc run is most of this file's time)."""
    cm = generate(blockc.parse_graph(every_variant()), {})
    return (cm, *nvcc_keeping_ptx(cm, tmp_path_factory.mktemp("every_variant")))


@needs_nvcc
def test_every_variant_compiles_for_sm80_and_sm90_without_spills(every_variant_build):
    """Warnings as errors; ptxas's report: each kernel every launcher can run
    (each tier of each op in each dtype), for both architectures, and no
    spill in any of them."""
    cm, result, _ = every_variant_build
    found = {(re.sub(r"^void ", "", k.demangled.split("(")[0]), k.arch): k for k in result.kernels
             if not k.short_name.startswith("ew_")}
    launched = set()
    for code in cm.steps:
        if code.ops != ["neg"]:
            launched |= {f"{code.name}_warp<{g}, {p}>"
                         for g, p in re.findall(rf"{code.name}_warp<(\d+), (\d+)>;", code.source)}
            launched |= {k for k in code.kernels if not k.endswith("_warp")}
    assert set(found) == {(name, arch) for name in launched for arch in ("sm_80", "sm_90")}
    symbolic = [code for code in cm.steps if code.ops != ["neg"] and re.search(r"_n(_sum)?$", code.name)]
    assert len(symbolic) == 3 * 10 and all(f"{code.name}_warp<{g}, {p}>" in launched for code in symbolic
                                           for g, p in REGISTER_TIERS)
    spilled = {name: (k.spill_store_bytes, k.spill_load_bytes) for name, k in found.items()
               if k.spill_store_bytes or k.spill_load_bytes or k.stack_frame_bytes}
    assert not spilled, spilled


@needs_nvcc
@pytest.mark.parametrize("t", ["f32", "f16"])
def test_every_vector_of_a_row_is_one_128_bit_access(t, every_variant_build):
    """In each register kernel, PACKS vectors a lane: one 128-bit load of
    each operand read by vectors (x; the residual, gamma and beta) and one
    128-bit store of each output (y; the sum) for each, none split into
    scalar accesses; in the shared-memory kernels one of each. Read in
    every_variant()'s sm_80 PTX, whose softmax, rmsnorm and add_layernorm
    with its sum are these ops at a symbolic length."""
    per_vector = {f"softmax_{t}_n": (1, 1), f"rmsnorm_{t}_n": (2, 1), f"add_layernorm_{t}_n_sum": (4, 2)}
    bodies = every_variant_build[2]["sm_80"]
    counted = set()
    for mangled, body in bodies.items():
        for name, (loads, stores) in per_vector.items():
            tiers = re.fullmatch(rf"_Z\d+{name}_warpILi(\d+)ELi(\d+)EE.*", mangled)
            if tiers or re.fullmatch(rf"_Z\d+{name}_smem.*", mangled):
                packs = int(tiers.group(2)) if tiers else 1
                found = (len(re.findall(r"ld\.global(\.nc)?\.v4", body)), len(re.findall(r"st\.global(\.wb)?\.v4", body)))
                assert found == (loads * packs, stores * packs), (mangled, found)
                counted.add((name, tiers.groups() if tiers else "smem"))
    assert len(counted) == len(per_vector) * (len(REGISTER_TIERS) + 1)
