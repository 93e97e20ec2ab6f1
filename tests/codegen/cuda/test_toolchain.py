"""Finding nvcc and NVIDIA's headers, the shared-memory rewrites, ptxas reports,
and compile errors that carry the compiler's own words."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from blockc.codegen.cuda import toolchain
from blockc.codegen.cuda.toolchain import (KernelResources, ToolchainError, declare_static_shared, find_nvcc,
                                           parse_ptxas_info, rewrite_dynamic_shared, rewrite_shared)


# ---- the source rewrites ------------------------------------------------------------------

@pytest.mark.parametrize("source, expected", [
    ("extern __shared__ float smem[];",
     "static float* const smem = reinterpret_cast<float*>(blockc_emu_dynamic_shared());"),
    ("  extern __shared__ __align__(16) unsigned char raw [ ];",
     "  static unsigned char* const raw = reinterpret_cast<unsigned char*>(blockc_emu_dynamic_shared());"),
    ("extern __shared__ alignas(16) __half h[];",
     "static __half* const h = reinterpret_cast<__half*>(blockc_emu_dynamic_shared());"),
    ("extern __shared__ float4 __align__(16) tile[];",
     "static float4* const tile = reinterpret_cast<float4*>(blockc_emu_dynamic_shared());"),
])
def test_extern_shared_becomes_a_pointer_on_the_same_line(source, expected):
    assert rewrite_dynamic_shared(source) == expected


def test_sources_without_extern_shared_are_untouched():
    text = "__shared__ float s[32];\nextern float g[];\n// extern __shared__ in a comment has no []\n"
    assert rewrite_dynamic_shared(text) == text


@pytest.mark.parametrize("source, expected", [
    ("  __shared__ float scratch[32];  // warp sums",
     "  __shared__ float scratch[32]; BLOCKC_EMU_SHARED(scratch);  // warp sums"),
    ("__shared__ float As[BK][BM + 1];", "__shared__ float As[BK][BM + 1]; BLOCKC_EMU_SHARED(As);"),
    ("__shared__ __align__(16) unsigned char smem[A > B ? A : B];",
     "__shared__ __align__(16) unsigned char smem[A > B ? A : B]; BLOCKC_EMU_SHARED(smem);"),
    ("__shared__ int n; __shared__ float m;",
     "__shared__ int n; BLOCKC_EMU_SHARED(n); __shared__ float m; BLOCKC_EMU_SHARED(m);"),
    ("extern __shared__ float4 tile[];", "extern __shared__ float4 tile[];"),  # dynamic: rewrite_dynamic_shared's
    ("__shared__ float a[4], b[4];", "__shared__ float a[4], b[4];"),  # two names: left alone, unchecked
])
def test_static_shared_is_declared_to_the_emulator_on_its_line(source, expected):
    assert declare_static_shared(source) == expected


def test_both_rewrites_keep_the_line_count():
    text = "extern __shared__ float dyn[];\n__global__ void k() {\n  __shared__ float s[8];\n}\n"
    out = rewrite_shared(text)
    assert out.count("\n") == text.count("\n") and "BLOCKC_EMU_SHARED(s);" in out and "extern" not in out


def test_racecheck_cannot_join_a_sanitizer(tmp_path):
    if toolchain.find_gxx() is None:
        pytest.skip("no g++")
    with pytest.raises(ValueError, match="racecheck"):
        toolchain.compile_emulated([], tmp_path / "x.so", sanitize="address", racecheck=True)


# ---- where nvcc comes from ------------------------------------------------------------------

def _fake_tool(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def no_system_cuda(monkeypatch, tmp_path):
    """Neither PATH nor /usr/local/cuda has nvcc, and no wheels are installed."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.setattr(toolchain, "STANDARD_CUDA", tmp_path / "no-cuda")
    monkeypatch.setattr(toolchain, "_nvidia_wheel_roots", lambda: [])


def test_nvcc_on_path_comes_first(monkeypatch, tmp_path, no_system_cuda):
    nvcc = _fake_tool(tmp_path / "bin" / "nvcc")
    monkeypatch.setenv("PATH", str(nvcc.parent))
    assert find_nvcc() == (str(nvcc), f"found on PATH: {nvcc}")


def test_nvcc_in_the_standard_location(monkeypatch, tmp_path, no_system_cuda):
    _fake_tool(tmp_path / "cuda" / "bin" / "nvcc")
    monkeypatch.setattr(toolchain, "STANDARD_CUDA", tmp_path / "cuda")
    assert find_nvcc().path == str(tmp_path / "cuda" / "bin" / "nvcc")


@pytest.mark.parametrize("layout", ["cu13/bin/nvcc", "cuda_nvcc/bin/nvcc"])
def test_nvcc_from_nvidias_wheels(monkeypatch, tmp_path, no_system_cuda, layout):
    root = tmp_path / "site-packages" / "nvidia"
    nvcc = _fake_tool(root / layout)
    monkeypatch.setattr(toolchain, "_nvidia_wheel_roots", lambda: [root])
    found = find_nvcc()
    assert found.path == str(nvcc) and "wheel" in found.reason


def test_no_nvcc_says_how_to_get_one(no_system_cuda):
    found = find_nvcc()
    assert found.path is None and "pip install 'blockc[cuda]'" in found.reason


def test_wheel_headers_are_include_dirs(monkeypatch, tmp_path, no_system_cuda):
    root = tmp_path / "nvidia"
    (root / "cu13" / "include").mkdir(parents=True)
    (root / "cu13" / "include" / "cuda_fp16.h").write_text("")
    (root / "cublas" / "include").mkdir(parents=True)
    (root / "cublas" / "include" / "cublas_v2.h").write_text("")
    (root / "cuda_runtime" / "include").mkdir(parents=True)  # empty: not a header folder
    monkeypatch.setattr(toolchain, "_nvidia_wheel_roots", lambda: [root])
    assert toolchain.cuda_include_dirs() == [os.path.realpath(root / "cu13" / "include"),
                                             os.path.realpath(root / "cublas" / "include")]


# ---- where cuBLASLt comes from ---------------------------------------------------------------

def _fake_cublas(include: Path, lib: Path, major: int, *, unversioned: bool) -> None:
    include.mkdir(parents=True, exist_ok=True)
    (include / "cublasLt.h").write_text("")
    lib.mkdir(parents=True, exist_ok=True)
    (lib / f"libcublasLt.so.{major}").write_text("")
    if unversioned:  # a toolkit has the development symlink, a wheel does not
        (lib / "libcublasLt.so").symlink_to(f"libcublasLt.so.{major}")


def test_cublas_from_the_toolkit_comes_first(monkeypatch, tmp_path, no_system_cuda):
    _fake_cublas(tmp_path / "cuda" / "include", tmp_path / "cuda" / "lib64", 13, unversioned=True)
    wheel = tmp_path / "nvidia"
    _fake_cublas(wheel / "cu13" / "include", wheel / "cu13" / "lib", 13, unversioned=False)
    monkeypatch.setattr(toolchain, "STANDARD_CUDA", tmp_path / "cuda")
    monkeypatch.setattr(toolchain, "_nvidia_wheel_roots", lambda: [wheel])
    found = toolchain.find_cublas()
    assert (found.include, found.lib, found.major) == (str(tmp_path / "cuda" / "include"),
                                                       str(tmp_path / "cuda" / "lib64"), 13)
    assert "toolkit" in found.where


@pytest.mark.parametrize("inc, lib, major", [("cu13/include", "cu13/lib", 13), ("cublas/include", "cublas/lib", 12)])
def test_cublas_from_nvidias_wheel_links_by_soname_with_an_rpath(monkeypatch, tmp_path, no_system_cuda, inc, lib,
                                                                  major):
    monkeypatch.setenv("BLOCKC_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "nvidia"
    _fake_cublas(root / inc, root / lib, major, unversioned=False)
    monkeypatch.setattr(toolchain, "_nvidia_wheel_roots", lambda: [root])
    found = toolchain.find_cublas()
    # not the wheel's shared include folder: a folder of cuBLAS's headers alone
    (headers,) = found.compile_flags()
    assert headers.startswith(f"-I{tmp_path / 'cache'}") and os.listdir(headers[2:]) == ["cublasLt.h"]
    # -lcublasLt would find nothing: the wheel ships only the versioned file
    build = tmp_path / "out" / "build"
    assert found.link_flags(build) == [f"-L{root / lib}", f"-l:libcublasLt.so.{major}", "-Xlinker",
                                       f"-rpath,$ORIGIN/../../nvidia/{lib}:{root / lib}"]
    assert "wheel" in found.where


def test_a_header_without_its_library_is_not_cublas(monkeypatch, tmp_path, no_system_cuda):
    root = tmp_path / "nvidia"
    (root / "cu13" / "include").mkdir(parents=True)
    (root / "cu13" / "include" / "cublasLt.h").write_text("")
    monkeypatch.setattr(toolchain, "_nvidia_wheel_roots", lambda: [root])
    with pytest.raises(ToolchainError, match=r"no cuBLASLt.*pip install 'blockc\[cuda\]'.*--gemm tiled"):
        toolchain.find_cublas()


# ---- ptxas reports ------------------------------------------------------------------------

PTXAS_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z7row_sumPKfPfi' for 'sm_80'
ptxas info    : Function properties for _Z7row_sumPKfPfi
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 1 barriers, 32 bytes smem, 372 bytes cmem[0]
ptxas info    : Function properties for _Z6helperf
    16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'gemm_tile' for 'sm_90'
ptxas info    : Function properties for gemm_tile
    96 bytes stack frame, 88 bytes spill stores, 120 bytes spill loads
ptxas info    : Used 255 registers, 16384 bytes smem, 400 bytes cmem[0], 8 bytes cmem[2]
"""


def test_ptxas_report_per_kernel_and_arch():
    row_sum, gemm = parse_ptxas_info(PTXAS_LOG)
    assert row_sum == KernelResources(name="_Z7row_sumPKfPfi", demangled=row_sum.demangled, arch="sm_80",
                                      registers=12, stack_frame_bytes=0, spill_store_bytes=0, spill_load_bytes=0,
                                      shared_bytes=32, constant_bytes=372, barriers=1)
    assert row_sum.short_name == "row_sum"
    assert (gemm.name, gemm.arch, gemm.registers, gemm.stack_frame_bytes) == ("gemm_tile", "sm_90", 255, 96)
    assert (gemm.spill_store_bytes, gemm.spill_load_bytes, gemm.shared_bytes, gemm.barriers) == (88, 120, 16384, 0)


# ---- failures carry the compiler's output ------------------------------------------------------

def test_emulated_compile_error_carries_gxx_output(tmp_path):
    if toolchain.find_gxx() is None:
        pytest.skip("g++ not found")
    bad = tmp_path / "bad.cu"
    bad.write_text("__global__ void k(float* x) { x[0] = undeclared_name; }\n")
    with pytest.raises(ToolchainError, match=r"(?s)g\+\+ failed to compile bad\.cu.*undeclared_name") as err:
        # a model's build's flags: the emulator runtime compiled beside the bad source (in parallel, and
        # waited for) is then the session's cached one, not a set of its own
        toolchain.compile_emulated([bad], tmp_path / "bad.so", extra_flags=["-DBLOCKC_EMULATE"])
    assert "g++" in err.value.command[0] and "undeclared_name" in err.value.output


def test_sanitizers_need_threads(tmp_path):
    with pytest.raises(ValueError, match="threads=True"):
        toolchain.compile_emulated([], tmp_path / "x.so", sanitize="address", threads=False)
    with pytest.raises(ValueError, match="sanitize must be"):
        toolchain.compile_emulated([], tmp_path / "x.so", sanitize="memory")


# ---- one CUDA: the toolchain layouts (fake ones: nvcc scripts and header folders) ----------

FAKE_NVCC = """#!/bin/sh
case "$*" in
  *--version*) echo "Cuda compilation tools, release {release}, V{release}.1" ;;
  *--list-gpu-arch*) printf 'compute_75\\ncompute_80\\ncompute_90\\ncompute_100\\ncompute_120\\n' ;;
  *--dryrun*) echo '#$ _HERE_={root}/bin'
              echo '#$ INCLUDES="-I{root}/bin/../include"  '
              echo '#$ SYSTEM_INCLUDES="-isystem" "{root}/bin/../include/cccl"  ' ;;
  *) echo "this fake nvcc compiles nothing" >&2; exit 1 ;;
esac
"""


def _fake_cuda(root: Path, release: str, *, headers: str | None = None, cccl: bool = True,
               cublas: str | None = "lib64") -> Path:
    """A CUDA at ``root``: bin/nvcc of ``release``, include/ with the runtime
    headers of ``headers`` (default: the same release), crt/, CCCL's
    nv/target, and cuBLASLt in ``cublas`` (None: no cuBLAS)."""
    nvcc = _fake_tool(root / "bin" / "nvcc")
    nvcc.write_text(FAKE_NVCC.format(release=release, root=root))
    include = root / "include"
    major, minor = map(int, (headers or release).split("."))
    (include / "crt").mkdir(parents=True)
    (include / "crt" / "host_runtime.h").write_text(f"// CUDA {headers or release}\n")
    (include / "cuda_runtime_api.h").write_text(f"#define CUDART_VERSION {major * 1000 + minor * 10}\n")
    if cccl:
        (include / "cccl" / "nv").mkdir(parents=True)
        (include / "cccl" / "nv" / "target").write_text("")
    if cublas:
        _fake_cublas(include, root / cublas, major, unversioned=cublas == "lib64")
    return nvcc


def test_system_cuda_alone_is_one_toolkit(monkeypatch, tmp_path, no_system_cuda):
    nvcc = _fake_cuda(tmp_path / "cuda", "13.0")
    monkeypatch.setattr(toolchain, "STANDARD_CUDA", tmp_path / "cuda")
    tk = toolchain.find_toolkit()
    assert (tk.nvcc, tk.version, tk.include, tk.include_flags) == (str(nvcc), (13, 0), str(tmp_path / "cuda" / "include"), ())
    cublas = toolchain.find_cublas(tk)
    assert cublas.own and cublas.compile_flags() == [f"-I{tmp_path / 'cuda' / 'include'}"]


def test_wheels_alone_are_one_toolkit(monkeypatch, tmp_path, no_system_cuda):
    root = tmp_path / "nvidia"
    nvcc = _fake_cuda(root / "cu13", "13.2", cublas="lib")
    monkeypatch.setattr(toolchain, "_nvidia_wheel_roots", lambda: [root])
    tk = toolchain.find_toolkit()
    assert (tk.nvcc, tk.release, tk.include) == (str(nvcc), "13.2", str(root / "cu13" / "include"))
    cublas = toolchain.find_cublas(tk)
    assert cublas.own and cublas.lib == str(root / "cu13" / "lib") and cublas.major == 13


def test_system_nvcc_with_newer_wheels_never_reads_the_wheels_runtime_headers(monkeypatch, tmp_path, no_system_cuda):
    # nvcc 13.0 on PATH, pip install ".[cuda]" brought 13.2: the wheels' shared include
    # folder holds 13.2's crt/host_runtime.h, which breaks 13.0's launch stubs if searched first
    monkeypatch.setenv("BLOCKC_CACHE", str(tmp_path / "cache"))
    system = _fake_cuda(tmp_path / "cuda-13.0", "13.0", cublas=None)
    monkeypatch.setenv("PATH", str(system.parent))
    wheels = tmp_path / "nvidia"
    _fake_cuda(wheels / "cu13", "13.2", cublas="lib")
    monkeypatch.setattr(toolchain, "_nvidia_wheel_roots", lambda: [wheels])
    tk = toolchain.find_toolkit()
    assert (tk.nvcc, tk.release) == (str(system), "13.0")
    from blockc.codegen.cuda import build as cuda_build
    from blockc.codegen.cuda.kernels.gemm import GemmChoice
    cmd = cuda_build.nvcc_command(tk, ("sm_80", "sm_90"), gemm=GemmChoice("cublas"), origin=str(tmp_path / "b"))
    assert cmd[0] == str(system)
    assert not [a for a in cmd if a.startswith("-I") and str(wheels) in a]   # no -I into the wheels
    (headers,) = [a[2:] for a in cmd if a.startswith("-I")]
    assert os.listdir(headers) == ["cublasLt.h"]     # cuBLAS's own headers, linked from the wheel
    assert f"-L{wheels / 'cu13' / 'lib'}" in cmd and "-l:libcublasLt.so.13" in cmd


def test_a_wheel_nvcc_with_another_releases_headers_is_refused(monkeypatch, tmp_path, no_system_cuda):
    root = tmp_path / "nvidia"
    _fake_cuda(root / "cu13", "13.2", headers="13.0")
    monkeypatch.setattr(toolchain, "_nvidia_wheel_roots", lambda: [root])
    with pytest.raises(ToolchainError, match=r"is CUDA 13\.2 but the headers beside it .* are CUDA 13\.0: use one "
                                             r"CUDA for both \(pip install 'nvidia-cuda-runtime==13\.2\.\*'"):
        toolchain.find_toolkit()


def test_a_wheel_nvcc_without_cccl_says_which_wheel(monkeypatch, tmp_path, no_system_cuda):
    root = tmp_path / "nvidia"
    _fake_cuda(root / "cu13", "13.2", cccl=False)
    monkeypatch.setattr(toolchain, "_nvidia_wheel_roots", lambda: [root])
    with pytest.raises(ToolchainError, match=r"no CCCL headers \(nv/target\).*pip install 'nvidia-cuda-cccl==13\.2\.\*'"):
        toolchain.find_toolkit()


def test_the_cuda_extra_installs_a_whole_toolkit():
    import tomllib
    with open(Path(__file__).parents[3] / "pyproject.toml", "rb") as f:
        extra = tomllib.load(f)["project"]["optional-dependencies"]["cuda"]
    names = {req.split(">")[0].split(";")[0].strip() for req in extra}
    assert {"nvidia-cuda-nvcc", "nvidia-cuda-runtime", "nvidia-cuda-cccl", "nvidia-cublas"} <= names


# ---- --arch: what the nvcc in use builds for --------------------------------------------------

@pytest.mark.parametrize("arch", ["sm_12", "sm_999", "sm_80a", "sm_90f", "compute_80"])
def test_an_arch_nvcc_does_not_list_is_refused(tmp_path, arch):
    nvcc = _fake_cuda(tmp_path / "cuda", "13.0")
    with pytest.raises(ToolchainError, match=rf"--arch {arch}: .*nvcc \(CUDA 13\.0\) cannot build for it; it builds "
                                             r"for sm_75, sm_80, sm_90, sm_100, sm_120"):
        toolchain.check_archs(str(nvcc), ["sm_80", arch])


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a", "sm_100f", "sm_120"])
def test_an_arch_nvcc_lists_passes(tmp_path, arch):
    toolchain.check_archs(str(_fake_cuda(tmp_path / "cuda", "13.0")), [arch])


def test_the_highest_arch_carries_ptx_beside_its_sass():
    assert toolchain.gencode_flags(["sm_90", "sm_80"]) == ["-gencode", "arch=compute_90,code=[sm_90,compute_90]",
                                                           "-gencode", "arch=compute_80,code=sm_80"]



@pytest.mark.skipif(find_nvcc().path is None, reason="no nvcc")
def test_each_arch_compiles_in_its_own_thread_and_its_report_stays_its_own(tmp_path, monkeypatch):
    # the archs' cicc and ptxas (nearly all of a compile) side by side: CI's
    # every-variant compiles take half the wall time; ptxas's report, written
    # by two threads, still names each kernel's arch
    commands = []
    run = toolchain.run_command
    monkeypatch.setattr(toolchain, "run_command", lambda cmd, **kw: commands.append(cmd) or run(cmd, **kw))
    src = tmp_path / "k.cu"
    src.write_text("__global__ void one(float* x) { x[threadIdx.x] += 1.0f; }\n"
                   "__global__ void two(double* x) { x[threadIdx.x] *= 2.0; }\n")
    result = toolchain.compile_nvcc(src, ["sm_80", "sm_90"])
    nvcc = [cmd for cmd in commands if "-c" in cmd]
    assert len(nvcc) == 1 and nvcc[0][nvcc[0].index("--threads") + 1] == "2", nvcc
    assert sorted((k.short_name, k.arch) for k in result.kernels) == [
        ("one", "sm_80"), ("one", "sm_90"), ("two", "sm_80"), ("two", "sm_90")]
    assert toolchain.arch_threads_flags(["sm_80"]) == []

def test_every_source_in_the_emulator_folder_is_part_of_the_runtime():
    """The emulator's folder holds the runtime and nothing else (a benchmark
    lives in bench/): every .cpp there is compiled into each emulated build."""
    assert set(toolchain.EMU_DIR.glob("*.cpp")) == set(toolchain.EMU_SOURCES)


@pytest.mark.skipif(toolchain.find_gxx() is None, reason="no g++")
@pytest.mark.parametrize("sanitize", [None, "address"])
def test_kernels_compile_against_the_cached_precompiled_emulator_header(tmp_path, monkeypatch, sanitize):
    """cuda_emu.h is most of each build: it is precompiled once per set of flags, and g++
    (asked with -H, which marks a used precompiled header with '!') takes it for the kernels.
    The flags are a model build's (emulated_library's), so the cached header and runtime this
    builds, or finds, are the ones every emulated model build of the session uses."""
    from blockc.files import cache_root
    from blockc.process import run_command
    if sanitize:
        try:
            toolchain.sanitizer_runtime(sanitize)
        except ToolchainError as e:
            pytest.skip(str(e))
    src = tmp_path / "k.cu"
    src.write_text("__global__ void fill(float* x) { x[threadIdx.x] = 1.0f; }\n")
    commands = []
    real_run = toolchain._run
    monkeypatch.setattr(toolchain, "_run", lambda cmd, what, timeout: (commands.append(cmd), real_run(cmd, what, timeout)))
    toolchain.compile_emulated([src], tmp_path / "k.so", sanitize=sanitize, extra_flags=["-DBLOCKC_EMULATE"])
    kernel, = [c for c in commands if c[-3].endswith("k.cu")]
    header = Path(kernel[kernel.index("-include") + 1])
    assert header.with_name("cuda_emu.h.gch").is_file() and header.is_relative_to(cache_root())
    said = run_command([*kernel[:-2], "-H", "-o", str(tmp_path / "again.o")], timeout=600)
    assert said.returncode == 0, said.stderr
    assert f"! {header}.gch" in said.stderr.splitlines()


@pytest.mark.skipif(toolchain.find_gxx() is None, reason="no g++")
def test_the_emulators_runtime_is_compiled_once_whatever_folders_a_build_includes(tmp_path, monkeypatch):
    """Each model's build includes its own folder (-I, one per model); the runtime's
    sources include none of it, so its cached objects serve every model's build."""
    made = []
    real_run = toolchain._run
    monkeypatch.setattr(toolchain, "_run", lambda cmd, what, timeout: (made.append(what), real_run(cmd, what, timeout)))
    for model in ("a", "b"):
        folder = tmp_path / model
        folder.mkdir()
        (folder / "k.cu").write_text("__global__ void fill(float* x) { x[threadIdx.x] = 1.0f; }\n")
        made.clear()
        toolchain.compile_emulated([folder / "k.cu"], folder / "k.so", extra_flags=["-DBLOCKC_EMULATE", f"-I{folder}"])
    assert made == ["compile k.cu", "link k.so"]
