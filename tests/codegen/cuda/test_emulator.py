"""The CUDA emulator: hand-written kernels (kernels/*.cu) run on the CPU and match
numpy; broken kernels abort with a message naming block, thread and lane, never hang;
the race checker names shared-memory races and reads of another block's values;
AddressSanitizer and ThreadSanitizer builds catch what numerics cannot."""
from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import ml_dtypes
import numpy as np
import pytest

from blockc.runtime.cuda_runner import CudaRunCrash, CudaRunError, CudaRunTimeout, linked_sanitizer, run_emulated

# The kernel libraries (conftest.py) are session fixtures only this module uses:
# under pytest-xdist its tests share one worker, which builds each library once.
pytestmark = pytest.mark.xdist_group("emulated kernel libraries")

BF16 = ml_dtypes.bfloat16


@dataclass
class Case:
    """One kernel entry: arguments for a shape, and a check of its outputs."""

    entry: str
    make: Callable[[np.random.Generator, bool], list]   # (rng, small) -> args
    check: Callable[[list, list], None]                 # (args, outputs) -> asserts


def _row_sum(rng, small):
    rows, cols = (2, 300) if small else (6, 1000)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    return [x, np.zeros(rows, np.float32), rows, cols]


def _check_row_sum(args, outs):
    np.testing.assert_allclose(outs[1], args[0].astype(np.float64).sum(1), rtol=1e-5, atol=1e-4)


def _softmax(rng, small):
    rows, cols = (2, 203) if small else (5, 1003)  # odd widths: unaligned heads and tails
    x = (3 * rng.standard_normal((rows, cols))).astype(np.float32)
    return [x, np.zeros_like(x), rows, cols]


def _check_softmax(args, outs):
    x = args[0].astype(np.float64)
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(outs[1], e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)


def _reverse(rng, small):
    n = 300 if small else 1000
    return [rng.standard_normal(n).astype(np.float32), np.zeros(n, np.float32), n, 128]


def _check_reverse(args, outs):
    x, n, block = args[0], args[2], args[3]
    padded = np.zeros(-(-n // block) * block, np.float32)
    padded[:n] = x
    np.testing.assert_array_equal(outs[1], padded.reshape(-1, block)[:, ::-1].reshape(-1)[:n])


def _carve(rng, small):
    n = 200 if small else 1000
    return [rng.standard_normal(n).astype(np.float32), np.zeros(n, np.float32), n, 96]


def _check_carve(args, outs):
    np.testing.assert_allclose(outs[1], 3 * args[0].astype(np.float64) + 1, rtol=1e-6, atol=1e-6)


def _histogram(rng, small):
    n, bins = (300, 7) if small else (1000, 13)
    values = rng.integers(0, 100, n).astype(np.int32)
    return [values, np.zeros(bins, np.int32), np.zeros(1, np.float32), np.full(1, -1, np.int32),
            np.full(1, -1, np.int32), np.zeros(1, np.uint32), np.full(n, -1, np.int32), n, bins]


def _check_histogram(args, outs):
    values, bins = args[0], args[-1]
    hist, total, biggest, first, slots, order = outs[1:7]
    np.testing.assert_array_equal(hist, np.bincount(values % bins, minlength=bins))
    np.testing.assert_allclose(total[0], 0.5 * values.sum(), rtol=1e-5)
    assert biggest[0] == values.max() and first[0] == 0 and slots[0] == len(values)
    np.testing.assert_array_equal(np.sort(order), np.sort(values))  # every slot taken once


def _mixed(rng, small):
    rows, cols = (2, 100) if small else (4, 333)
    a = rng.uniform(-2, 2, (rows, cols)).astype(np.float16)
    b = rng.uniform(-2, 2, (rows, cols)).astype(BF16)
    return [a, b, np.zeros(rows, np.float32), np.zeros_like(a), np.zeros_like(b), rows, cols]


def _check_mixed(args, outs):
    a, b = args[0].astype(np.float64), args[1].astype(np.float64)
    np.testing.assert_allclose(outs[2], (a * b).sum(1), rtol=1e-5, atol=1e-4)
    # Each half/bfloat16 op rounds; compare at a few units of the format's last place.
    np.testing.assert_allclose(outs[3].astype(np.float64), np.sqrt(np.abs(a)) * b + np.exp(a), rtol=4e-3, atol=4e-3)
    a_bf = args[0].astype(np.float32).astype(BF16).astype(np.float64)
    np.testing.assert_allclose(outs[4].astype(np.float64), np.sqrt(np.abs(a_bf)) * b + np.exp(a_bf),
                               rtol=3e-2, atol=3e-2)


def _warp_ops(rng, small):
    n = 64
    return [rng.integers(-100, 100, n).astype(np.int32), np.zeros(12 * n, np.int32), n]


def _check_warp_ops(args, outs):
    """The lane rules as CUDA's documentation states them, written out independently."""
    x, n = args[0].astype(np.int64), args[2]
    got = outs[1].reshape(12, n)
    want = np.zeros((12, n), np.int64)
    for t in range(n):
        base, lane = t - t % 32, t % 32
        warp = x[base:base + 32]
        want[0, t] = warp[lane - 1] if lane % 8 >= 1 else warp[lane]             # up 1, width 8
        want[1, t] = warp[lane + 3] if lane + 3 < 32 else warp[lane]            # down 3
        want[2, t] = warp[lane ^ 5]                                             # xor 5, width 16
        want[3, t] = warp[lane // 8 * 8 + (lane * 3) % 8]                       # idx, width 8
        want[4, t] = sum(1 << k for k in range(32) if warp[k] > 0)              # ballot
        want[5, t] = int((warp > 90).any())
        want[6, t] = int((warp > -100).all())
        want[7, t] = warp.sum()
        want[8, t] = sum(1 << k for k in range(32) if warp[k] & 3 == warp[lane] & 3)
        want[9, t] = warp[lane ^ 1] if lane < 16 else -warp[lane]
        want[10, t] = 0xFFFFFFFF
        want[11, t] = (x > 0).sum()
    np.testing.assert_array_equal(got, want.astype(np.uint32).view(np.int32).reshape(12, n))


CASES = {
    "block_reduce": Case("run_row_sum", _row_sum, _check_row_sum),
    "softmax_float4": Case("run_softmax", _softmax, _check_softmax),
    "extern_shared_block_scope": Case("run_reverse_chunks", _reverse, _check_reverse),
    "extern_shared_file_scope": Case("run_carve", _carve, _check_carve),
    "atomics": Case("run_histogram", _histogram, _check_histogram),
    "half_bfloat16": Case("run_mixed_precision", _mixed, _check_mixed),
    "warp_ops": Case("run_warp_ops", _warp_ops, _check_warp_ops),
}


def _run_case(lib, name: str, small: bool) -> None:
    case = CASES[name]
    args = case.make(np.random.default_rng(0), small)
    before = [a.copy() for a in args if isinstance(a, np.ndarray)]
    outs = run_emulated(lib, case.entry, args, timeout=60)
    for a, b in zip(before, (a for a in args if isinstance(a, np.ndarray))):
        np.testing.assert_array_equal(a, b)  # the caller's arrays are never written
    case.check(args, outs)


@pytest.mark.parametrize("name", CASES)
def test_kernels_match_numpy_on_fibers(fiber_lib, name):
    _run_case(fiber_lib, name, small=False)


@pytest.mark.parametrize("name", CASES)
def test_kernels_run_clean_under_address_sanitizer(asan_lib, name):
    _run_case(asan_lib, name, small=True)


@pytest.mark.parametrize("name", CASES)
def test_kernels_run_clean_under_thread_sanitizer(tsan_lib, name):
    _run_case(tsan_lib, name, small=True)


def test_sanitizer_builds_are_recognised(fiber_lib, asan_lib, tsan_lib):
    assert (linked_sanitizer(fiber_lib), linked_sanitizer(asan_lib), linked_sanitizer(tsan_lib)) == \
        (None, "address", "thread")


# ---- broken kernels: diagnosed, named, never hung ---------------------------------------

@pytest.fixture(params=["fibers", "threads"])
def any_mode_lib(request, fiber_lib):
    """The fiber build, and a build with one OS thread per CUDA thread (the ASan one)."""
    return fiber_lib if request.param == "fibers" else request.getfixturevalue("asan_lib")


def test_barrier_deadlock_names_block_and_threads(any_mode_lib):
    with pytest.raises(CudaRunCrash) as err:
        run_emulated(any_mode_lib, "run_partial_barrier", [np.zeros(256, np.float32)], timeout=20)
    msg = str(err.value)
    assert "barrier deadlock" in msg and "kernel partial_barrier" in msg and "block (0,0,0)" in msg
    # Threads 0-63 wait at the barrier on line 8; 64-127 return. In thread mode any may come first.
    assert re.search(r"thread \(([0-9]|[1-5][0-9]|6[0-3]),0,0\) \[warp [01] lane \d+\] waits at __syncthreads "
                     r"at \S*faults\.cu:8, but thread \((6[4-9]|[7-9][0-9]|1[01][0-9]|12[0-7]),0,0\) "
                     r"\[warp [23] lane \d+\] has exited", msg), msg


def test_divergent_full_mask_shuffle_names_the_missing_lane(any_mode_lib):
    with pytest.raises(CudaRunCrash) as err:
        run_emulated(any_mode_lib, "run_divergent_shuffle", [np.zeros(64, np.float32)], timeout=20)
    msg = str(err.value)
    assert "divergent warp" in msg
    # In each of the two warps, lanes 0-15 wait in the shuffle; 16-31 skip it and exit. In thread
    # mode either warp may be caught first, and its lanes in any order.
    found = re.search(r"lane \d+ \(thread \(\d+,0,0\) \[warp ([01]) lane \d+\]\) waits in __shfl_sync\(mask 0xffffffff\) "
                      r"at \S*faults\.cu:15 for lane (1[6-9]|2\d|3[01]) \(thread \((\d+),0,0\)", msg)
    assert found, msg
    warp, lane, thread = map(int, found.groups())
    assert thread == 32 * warp + lane, msg
    assert "has exited" in msg and "block (0,0,0)" in msg


def test_threads_at_different_barriers_are_reported(any_mode_lib):
    with pytest.raises(CudaRunCrash, match=r"threads wait at different barriers: .*faults\.cu:\d+.*faults\.cu:\d+"):
        run_emulated(any_mode_lib, "run_split_barrier", [np.zeros(64, np.float32)], timeout=20)


def test_wild_write_names_the_faulting_thread(fiber_lib):
    with pytest.raises(CudaRunCrash, match=r"wild_write.*Segmentation fault in thread \(3,0,0\) \[warp 0 lane 3\]") as err:
        run_emulated(fiber_lib, "run_wild_write", [np.zeros(32, np.float32), 1 << 40], timeout=20)
    assert err.value.returncode < 0


def test_fiber_stack_overflow_is_named(fiber_lib):
    with pytest.raises(CudaRunCrash, match=r"stack_hog.*fiber stack overflow in thread \(0,0,0\).*BLOCKC_EMU_STACK_KB"):
        run_emulated(fiber_lib, "run_stack_hog", [np.zeros(32, np.float32)], timeout=20)


def test_endless_kernel_times_out(fiber_lib):
    with pytest.raises(CudaRunTimeout, match="did not finish within 1.5 s"):
        run_emulated(fiber_lib, "run_spin_forever", [np.zeros(1, np.int32)], timeout=1.5)


def test_shared_memory_overflow_caught_by_address_sanitizer(asan_lib):
    with pytest.raises(CudaRunCrash) as err:
        run_emulated(asan_lib, "run_shared_overflow", [np.ones(96, np.float32), np.zeros(96, np.float32), 96])
    assert "AddressSanitizer: global-buffer-overflow" in err.value.stderr
    assert "faults.cu:22 in shared_overflow" in err.value.stderr


def test_shared_memory_race_caught_by_thread_sanitizer(tsan_lib):
    with pytest.raises(CudaRunCrash) as err:
        run_emulated(tsan_lib, "run_shared_race", [np.ones(128, np.float32), np.zeros(128, np.float32)])
    assert "ThreadSanitizer: data race" in err.value.stderr
    assert re.search(r"faults\.cu:3[01] in shared_race", err.value.stderr)


# ---- shared memory: races and values left by another block ---------------------------------

@pytest.fixture(params=["fibers", "threads"])
def racecheck_lib(request, fiber_lib):
    """The race-checked builds: fibers, and one OS thread per CUDA thread."""
    return fiber_lib if request.param == "fibers" else request.getfixturevalue("threads_lib")


def test_missing_syncthreads_is_a_race_naming_variable_lines_and_threads(racecheck_lib):
    x = np.arange(128, dtype=np.float32)
    with pytest.raises(CudaRunCrash) as err:
        run_emulated(racecheck_lib, "run_shared_race", [x, np.zeros_like(x)], timeout=20)
    msg = str(err.value)
    assert "error in kernel shared_race, block (0,0,0)" in msg
    m = re.search(r"shared memory race \((write after read|read after write)\) on 4 bytes at offset (\d+) of "
                  r"`buf` \(__shared__, faults\.cu:29, 512 bytes\)", msg)
    assert m, msg
    # Thread k writes buf[k] at line 30; thread k-1 reads it at line 31. Which comes
    # first depends on the schedule (fibers run thread 0 first), not whether it is found.
    k = int(m.group(2)) // 4
    assert f"thread ({k},0,0)" in msg and f"thread ({(k - 1) % 128},0,0)" in msg, msg
    assert "faults.cu:30 (shared_race)" in msg and "faults.cu:31 (shared_race)" in msg
    assert re.search(r"with no (__syncwarp\(\) naming both lanes or )?__syncthreads\(\) between them", msg)


def test_the_same_kernel_with_its_barrier_is_clean(racecheck_lib):
    x = np.arange(128, dtype=np.float32)
    _, y = run_emulated(racecheck_lib, "run_shared_ring", [x, np.zeros_like(x), 1], timeout=20)
    np.testing.assert_array_equal(y, np.roll(x, -1))


def test_a_race_on_file_scope_shared_memory_is_reported(racecheck_lib):
    x = np.arange(128, dtype=np.float32)
    with pytest.raises(CudaRunCrash, match=r"shared memory race .* of `ring` \(__shared__, races\.cu:8, 512 bytes\)"):
        run_emulated(racecheck_lib, "run_shared_ring", [x, np.zeros_like(x), 0], timeout=20)


def test_reading_a_previous_blocks_shared_value_is_reported(racecheck_lib):
    with pytest.raises(CudaRunCrash) as err:
        run_emulated(racecheck_lib, "run_stale_shared", [np.zeros(64, np.float32)], timeout=20)
    msg = str(err.value)
    assert "error in kernel stale_shared, block (1,0,0)" in msg
    assert re.search(r"thread \(\d+,0,0\) \[warp 0 lane \d+\] reads 4 bytes at offset 0 of `total` \(__shared__, "
                     r"races\.cu:18, 4 bytes\) at races\.cu:21 \(stale_shared\), which no thread of this block has "
                     r"written", msg), msg


def test_without_the_checker_a_previous_blocks_shared_value_reads_as_nan(asan_lib):
    y = run_emulated(asan_lib, "run_stale_shared", [np.zeros(64, np.float32)])[0].reshape(2, 32)
    assert (y[0] == 1).all() and np.isnan(y[1]).all()


@pytest.mark.parametrize("how, ordered", [(0, False), (1, True), (2, False)], ids=["nothing", "syncwarp", "shuffle"])
def test_within_a_warp_only_syncwarp_orders_shared_memory(racecheck_lib, how, ordered):
    args = [np.zeros(32, np.float32), how]
    if ordered:
        np.testing.assert_array_equal(run_emulated(racecheck_lib, "run_warp_handoff", args, timeout=20)[0],
                                      np.roll(np.arange(32, dtype=np.float32), -1))
        return
    with pytest.raises(CudaRunCrash, match=r"shared memory race .* of `slot` .* with no __syncwarp\(\) naming both "
                                           r"lanes or __syncthreads\(\) between them"):
        run_emulated(racecheck_lib, "run_warp_handoff", args, timeout=20)


def test_shared_atomics_do_not_race_with_each_other(racecheck_lib):
    flags = (np.arange(128) % 3 == 0).astype(np.int32)
    _, counts = run_emulated(racecheck_lib, "run_shared_count", [flags, np.zeros(2, np.int32)], timeout=20)
    np.testing.assert_array_equal(counts, flags.reshape(2, 64).sum(1))


def test_halves_sharing_a_word_are_not_a_race(racecheck_lib):
    x = np.arange(64).astype(np.float16)
    _, y = run_emulated(racecheck_lib, "run_half_pairs", [x, np.zeros_like(x)], timeout=20)
    np.testing.assert_array_equal(y, x.reshape(32, 2)[:, ::-1].reshape(-1))

# ---- stream capture and CUDA graphs ---------------------------------------------------------

@pytest.fixture(params=["fibers", "address"])
def fiber_or_asan_lib(request, fiber_lib):
    """The fiber build, and the AddressSanitizer one (a capture keeps copies of launch arguments)."""
    return fiber_lib if request.param == "fibers" else request.getfixturevalue("asan_lib")


def test_graphs_replay_what_was_captured_update_and_refuse_what_cuda_refuses(fiber_or_asan_lib):
    n = 300
    x = np.arange(n, dtype=np.float32) / 7
    fill = np.full(n, -1, np.float32)
    _, y, w, z, facts = run_emulated(fiber_or_asan_lib, "run_graphs",
                                     [x, fill, fill, fill, np.zeros(16, np.int32), n])
    assert facts[0] == 1, "the capture ran a launch instead of recording it"
    np.testing.assert_allclose(y, 2 * x + 1, rtol=1e-6)          # replayed (twice)
    np.testing.assert_allclose(w, 4 * x + 1, rtol=1e-6)          # the update's new arguments
    np.testing.assert_allclose(z, 3 * (4 * x + 1), rtol=1e-6)    # after the update's memset and second kernel
    assert facts[1] == 0                                         # cudaGraphExecUpdate: the same nodes
    assert (facts[2], facts[3]) == (910, 2)                      # another topology: cudaErrorGraphExecUpdateFailure
    assert facts[4] == 900                                       # the legacy stream: cudaErrorStreamCaptureUnsupported
    assert (facts[5], facts[6], facts[7]) == (900, 901, 1)       # cudaMalloc refused, the capture invalidated
    assert (facts[8], facts[9]) == (9, 901)                      # a bad launch: reported, the capture invalidated


# ---- launch limits and the calling convention --------------------------------------------

def test_dynamic_shared_memory_over_48k_needs_the_attribute(fiber_lib):
    x = np.arange(256, dtype=np.float32)
    with pytest.raises(CudaRunError, match=r"returned 1 \(cudaErrorInvalidValue\)(.|\n)*65536 bytes of dynamic shared memory"):
        run_emulated(fiber_lib, "run_big_shared", [x, np.zeros_like(x), 256, 0])
    _, y = run_emulated(fiber_lib, "run_big_shared", [x, np.zeros_like(x), 256, 1])
    np.testing.assert_array_equal(y, x[::-1])


def test_arguments_must_be_arrays_or_ints(fiber_lib):
    with pytest.raises(TypeError, match="1-element arrays"):
        run_emulated(fiber_lib, "run_row_sum", [np.zeros((1, 1), np.float32), np.zeros(1, np.float32), 1.0, 1])
    with pytest.raises(TypeError, match="not bool"):
        run_emulated(fiber_lib, "run_row_sum", [np.zeros((1, 1), np.float32), np.zeros(1, np.float32), True, 1])


def test_missing_entry_point_is_an_emulation_error(fiber_lib):
    with pytest.raises(CudaRunCrash, match="no_such_entry"):
        run_emulated(fiber_lib, "no_such_entry", [])


# ---- bench/emu_context_switch.cpp: the switch's benchmark times the emulator's own switch ----

@pytest.mark.skipif(shutil.which("g++") is None or shutil.which("nm") is None, reason="no g++ or nm")
def test_the_context_switch_benchmark_builds_and_times_the_emulators_own_switch(tmp_path):
    bench = Path(__file__).parents[3] / "bench" / "emu_context_switch.cpp"
    exe = tmp_path / "emu_switch"
    # the benchmark's documented command, at one block instead of 40
    subprocess.run(["g++", "-O2", "-std=c++20", "-pthread", "-DBENCH_BLOCKS=1", str(bench), "-o", str(exe)],
                   check=True, timeout=300)
    printed = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=120).stdout
    assert "1 blocks x 256 threads x 64 barriers" in printed and "fiber switch :" in printed
    # the fibers switch through the emulator's function, not a copy under another name
    symbols = subprocess.run(["nm", str(exe)], check=True, capture_output=True, text=True).stdout.split()
    assert "blockc_emu_switch" in symbols and "blockc_emu_fiber_start" in symbols
    assert "asm(" not in bench.read_text()
