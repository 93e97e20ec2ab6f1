"""Compilers for generated CUDA: g++ with the CPU emulator, and nvcc.

``compile_emulated`` builds a ``.cu`` into a shared library that runs on the CPU:
g++ compiles it as C++ with ``emu/cuda_emu.h`` force-included and links the
emulator's runtime (``emu/cuda_emu_*.cpp``).
Only NVIDIA's headers are needed, not a GPU. ``runtime.cuda_runner.run_emulated`` runs it.

``compile_nvcc`` compiles the same file for real GPUs (sm_80 and sm_90 by
default) with warnings as errors, and returns ptxas's per-kernel resource
report (registers, spills, shared memory).

Where things are found:

* nvcc: ``$PATH``, then ``/usr/local/cuda/bin/nvcc``, then NVIDIA's
  ``nvidia-cuda-nvcc`` wheel (``nvidia/cu13/bin/nvcc`` for CUDA 13,
  ``nvidia/cuda_nvcc/bin/nvcc`` for the ``-cu12`` wheels).
* ``find_toolkit``: that nvcc and the headers of its own release -- the
  folders its ``--dryrun`` says it searches -- checked to agree
  (``CUDART_VERSION``) and to hold CCCL (``nv/target``). Headers of two CUDAs
  are never mixed. ``check_archs`` asks that nvcc which archs it builds for.
* headers for the emulator (``cuda_fp16.h``): the toolkit beside nvcc,
  ``/usr/local/cuda/include``, then the wheels' ``include`` folders.
* cuBLASLt (``find_cublas``): a header and its library from one place, of the
  toolkit's major release -- the toolkit beside nvcc, ``/usr/local/cuda``,
  then the ``nvidia-cublas`` wheel -- linked by its versioned name
  (``-l:libcublasLt.so.13``: the wheel ships no unversioned ``.so``) with a
  RUNPATH to its folder, relative to ``$ORIGIN`` and absolute.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Sequence

from blockc.errors import BlockcError
from blockc.files import StatIdentity, cache_root, cached_file, partial_prefix, stat_identity
from blockc.process import run_command

EMU_DIR = Path(__file__).resolve().parent / "emu"
EMU_HEADER = EMU_DIR / "cuda_emu.h"
EMU_SOURCES = tuple(EMU_DIR / f"cuda_emu_{part}.cpp"
                    for part in ("sched", "fibers", "threads", "racecheck", "runtime", "streams"))
STANDARD_CUDA = Path("/usr/local/cuda")
DEFAULT_ARCHS = ("sm_80", "sm_90")
SANITIZERS = ("address", "thread")

# Wheel layouts, newest first: CUDA 13 puts every component under nvidia/cu13,
# CUDA 12 gives each its own folder.
_WHEEL_NVCC = ("cu13/bin/nvcc", "cu12/bin/nvcc", "cuda_nvcc/bin/nvcc")
_WHEEL_INCLUDES = ("cu13/include", "cu12/include", "cuda_runtime/include", "cuda_nvcc/include",
                   "cuda_cccl/include", "cublas/include")


_HEADER_MARKERS = ("cuda_runtime.h", "cuda_fp16.h", "cublas_v2.h", "cublasLt.h", "cuda/std")
# Where cuBLAS sits in each layout: (include folder, library folders), relative
# to a toolkit or to the wheels' ``nvidia`` folder.
_TOOLKIT_CUBLAS = ("include", ("lib64", "lib", "targets/x86_64-linux/lib"))
_WHEEL_CUBLAS = (("cu13/include", ("cu13/lib",)), ("cu12/include", ("cu12/lib",)),
                 ("cublas/include", ("cublas/lib",)))
_CUBLASLT_SO = re.compile(r"^libcublasLt\.so\.(\d+)$")


BUILD_TIMEOUT = 600.0   # seconds a compile may take before it is killed (g++ and nvcc alike)


class ToolchainError(BlockcError):
    """A compiler is missing, or a compile failed; carries the command and its output."""

    def __init__(self, message: str, command: Sequence[str] = (), output: str = ""):
        self.command, self.output = list(command), output
        text = message
        if command:
            text += "\n  command: " + " ".join(map(str, command))
        if output:
            text += "\n" + _tail(output, 60)
        super().__init__(text)


class NvccSearch(NamedTuple):
    """Where nvcc is (``path``), or None; ``reason`` says where or why not."""

    path: str | None
    reason: str


def _tail(text: str, lines: int) -> str:
    rows = text.rstrip().splitlines()
    cut = rows[-lines:]
    return ("  ...\n" if len(rows) > lines else "") + "\n".join("  " + r for r in cut)


def _nvidia_wheel_roots() -> list[Path]:
    """The folders of the ``nvidia`` namespace package that NVIDIA's wheels install."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    return [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []


def find_nvcc() -> NvccSearch:
    """Locate nvcc: ``$PATH``, the standard toolkit folder, then the PyPI wheels."""
    on_path = shutil.which("nvcc")
    if on_path:
        return NvccSearch(on_path, f"found on PATH: {on_path}")
    standard = STANDARD_CUDA / "bin" / "nvcc"
    if os.access(standard, os.X_OK):
        return NvccSearch(str(standard), f"found in the standard location {standard}")
    for root in _nvidia_wheel_roots():
        for rel in _WHEEL_NVCC:
            candidate = root / rel
            if os.access(candidate, os.X_OK):
                return NvccSearch(str(candidate), f"found in NVIDIA's nvcc wheel: {candidate}")
    return NvccSearch(None, "no nvcc: not on PATH, not in /usr/local/cuda/bin, and no nvidia-cuda-nvcc "
                            "wheel installed (pip install 'blockc[cuda]' or install the CUDA toolkit)")


def _toolkit_of(nvcc: str) -> Path:
    return nvcc_layout(nvcc)[0]


def nvcc_layout(nvcc: str) -> tuple[Path, tuple[Path, ...]]:
    """nvcc's toolkit folder and the header folders it searches by itself, as
    its own ``--dryrun`` says (``_HERE_``, ``INCLUDES``, ``SYSTEM_INCLUDES``):
    a wrapper script's folder (/usr/local/bin/nvcc) is no toolkit."""
    said = _nvcc_says(nvcc, "--dryrun", "-E", "-x", "cu", os.devnull)
    text = "" if isinstance(said, Exception) else said[1] + said[2]
    here = re.search(r"^#\$ _HERE_=(.+)$", text, re.M)
    root = Path(os.path.normpath(here.group(1) if here else os.path.dirname(os.path.realpath(nvcc)))).parent
    searched = [Path(os.path.normpath(p.removeprefix("-I")))
                for line in re.findall(r"^#\$ (?:SYSTEM_)?INCLUDES=(.*)$", text, re.M)
                for p in re.findall(r'"([^"]+)"', line) if p != "-isystem"]
    return root, tuple(searched or [root / "include", root / "include" / "cccl", root / "targets" / "x86_64-linux" /
                                    "include", root / "targets" / "x86_64-linux" / "include" / "cccl"])


def cuda_include_dirs() -> list[str]:
    """Folders holding NVIDIA's headers, best first, existing ones only, no repeats."""
    candidates: list[Path] = []
    nvcc = find_nvcc().path
    if nvcc:
        toolkit = _toolkit_of(nvcc)
        candidates += [toolkit / "include", toolkit / "targets" / "x86_64-linux" / "include"]
    candidates.append(STANDARD_CUDA / "include")
    for root in _nvidia_wheel_roots():
        candidates += [root / rel for rel in _WHEEL_INCLUDES]
    seen: list[str] = []
    for c in candidates:
        real = os.path.realpath(c)
        # A wrapper script's parent (/usr/local/bin/nvcc) is no toolkit: keep real ones.
        if real not in seen and any(os.path.exists(os.path.join(real, h)) for h in _HEADER_MARKERS):
            seen.append(real)
    return seen


# ---- one CUDA: nvcc and the headers of its release --------------------------------------

_NVCC_RELEASE = re.compile(r"release (\d+)\.(\d+)")
_CUDART_VERSION = re.compile(r"#define\s+CUDART_VERSION\s+(\d+)")


@dataclass(frozen=True)
class Toolkit:
    """One CUDA release that builds for a GPU: its ``nvcc``, its ``version``
    (major, minor), the folder of the headers of that same release
    (``cuda_runtime_api.h``, ``crt/``) and ``include_flags`` for any of its
    header folders nvcc does not search by itself (CUDA 12's wheels give each
    component its own folder)."""

    nvcc: str
    version: tuple[int, int]
    include: str
    include_flags: tuple[str, ...]
    where: str

    @property
    def release(self) -> str:
        return "%d.%d" % self.version


def nvcc_release(nvcc: str) -> tuple[int, int]:
    """The CUDA release ``nvcc --version`` names, e.g. (13, 0)."""
    m = _NVCC_RELEASE.search(compiler_version(nvcc))
    if not m:
        raise ToolchainError(f"cannot tell which CUDA {nvcc} is: its --version names no release")
    return int(m.group(1)), int(m.group(2))


def _header_release(include: Path) -> tuple[int, int] | None:
    m = _CUDART_VERSION.search((include / "cuda_runtime_api.h").read_text(errors="replace"))
    return (int(m.group(1)) // 1000, int(m.group(1)) % 1000 // 10) if m else None


def find_toolkit() -> Toolkit:
    """The CUDA that builds for a GPU: the nvcc ``find_nvcc`` finds and the
    headers beside it, checked to be of its release and complete. Headers of
    two CUDAs are never mixed: another release's ``crt/host_runtime.h`` breaks
    every kernel's launch stub (``__cudaLaunch``). Raises ToolchainError
    naming what is missing or mismatched and how to fix it."""
    found = find_nvcc()
    if found.path is None:
        raise ToolchainError(found.reason)
    version = nvcc_release(found.path)
    release = "%d.%d" % version
    root, own = nvcc_layout(found.path)
    split = [root.parent / part / "include" for part in ("cuda_runtime", "cuda_cccl")]  # CUDA 12's wheels
    runtime = next((d for d in [*own, *split] if (d / "cuda_runtime_api.h").is_file()), None)
    if runtime is None:
        raise ToolchainError(f"nvcc {found.path} (CUDA {release}) has no CUDA headers beside it (no "
                             f"cuda_runtime_api.h in {', '.join(map(str, own))}): install the toolkit's headers, or "
                             f"pip install 'nvidia-cuda-runtime=={release}.*' for the wheel nvcc")
    headers = _header_release(runtime)
    if headers != version:
        shown = "%d.%d" % headers if headers else "of an unknown release"
        raise ToolchainError(f"nvcc {found.path} is CUDA {release} but the headers beside it ({runtime}) are "
                             f"CUDA {shown}: use one CUDA for both (pip install 'nvidia-cuda-runtime=={release}.*' "
                             "beside a wheel nvcc, or put the nvcc of those headers first on PATH)")
    cccl = next((d for d in [*own, *split] if (d / "nv" / "target").exists()), None)
    if cccl is None:
        raise ToolchainError(f"nvcc {found.path} (CUDA {release}) has no CCCL headers (nv/target) beside it: "
                             f"pip install 'nvidia-cuda-cccl=={release}.*', or install the toolkit's headers")
    flags = tuple(f"-I{d}" for d in dict.fromkeys((runtime, cccl)) if d not in own)
    return Toolkit(found.path, version, os.path.realpath(runtime), flags, found.reason)


def _nvcc_says(nvcc: str, *args: str) -> tuple[int, str, str] | Exception:
    """``(returncode, stdout, stderr)`` of ``nvcc ARGS``, or why it could not
    run; asked once per nvcc (its real path and ``files.stat_identity``), so a
    toolkit replaced or rewritten in place is asked again."""
    real = os.path.realpath(nvcc)
    return _asked(real, stat_identity(real), args)


@functools.lru_cache(maxsize=None)
def _asked(nvcc: str, stamp: StatIdentity, args: tuple[str, ...]) -> tuple[int, str, str] | Exception:
    try:
        done = run_command([nvcc, *args], timeout=60)
    except OSError as e:
        return e
    if done.timed_out:
        return TimeoutError(f"{nvcc} {' '.join(args)} took longer than 60 s")
    return done.returncode, done.stdout, done.stderr


def gpu_archs(nvcc: str) -> tuple[int, ...]:
    """The ``sm_XX`` numbers ``nvcc --list-gpu-arch`` builds for (asked once per nvcc)."""
    said = _nvcc_says(nvcc, "--list-gpu-arch")
    real = os.path.realpath(nvcc)
    if isinstance(said, Exception):
        raise ToolchainError(f"cannot run {real} --list-gpu-arch: {said}") from None
    returncode, out, err = said
    numbers = tuple(int(n) for n in re.findall(r"\bcompute_(\d+)\b", out))
    if returncode != 0 or not numbers:
        raise ToolchainError(f"{real} --list-gpu-arch lists no architecture", [real, "--list-gpu-arch"], out + err)
    return numbers


def check_archs(nvcc: str, archs: Sequence[str]) -> None:
    """Refuse an ``sm_XX`` this nvcc cannot build for, before nvcc runs: a
    number it does not list, ``a`` (arch-specific) below sm_90, ``f`` (family)
    below sm_100."""
    listed = gpu_archs(nvcc)
    for arch in archs:
        m = re.fullmatch(r"sm_(\d+)([af]?)", arch)
        number = int(m.group(1)) if m else None
        if m and number in listed and number >= {"": 0, "a": 90, "f": 100}[m.group(2)]:
            continue
        raise ToolchainError(f"--arch {arch}: {nvcc} (CUDA {'%d.%d' % nvcc_release(nvcc)}) cannot build for it; "
                             f"it builds for {', '.join(f'sm_{n}' for n in sorted(listed))} (with a suffix "
                             "'a' from sm_90 on, 'f' from sm_100 on)")


def gencode_flags(archs: Sequence[str]) -> list[str]:
    """SASS for each arch, and the highest one's PTX beside its SASS, so a GPU
    newer than every listed arch still runs the build (its driver compiles the PTX)."""
    top = max(archs, key=lambda a: int(re.sub(r"\D", "", a) or 0))
    flags = []
    for arch in archs:
        code = f"[{arch},compute_{arch[3:]}]" if arch == top else arch
        flags += ["-gencode", f"arch=compute_{arch[3:]},code={code}"]
    return flags


def arch_threads_flags(archs: Sequence[str]) -> list[str]:
    """One nvcc thread per arch: each arch's cicc and ptxas (nearly all of a
    compile's time) run side by side, not one after the other. nvcc gathers
    each step's output, so ptxas's report stays one arch's block at a time."""
    return ["--threads", str(len(archs))] if len(archs) > 1 else []


# ---- cuBLASLt -------------------------------------------------------------------------

@dataclass(frozen=True)
class CublasLocation:
    """One cuBLASLt: its header folder, its library folder, the library's
    major version (the ``N`` of ``libcublasLt.so.N``) and where it was found.
    ``own`` says the header folder is the toolkit's own; any other (a wheel's
    shared ``include``, which may hold another CUDA's runtime headers) is
    reached through a folder of cuBLAS's headers alone."""

    include: str
    lib: str
    major: int
    where: str
    own: bool = False

    def compile_flags(self) -> list[str]:
        return [f"-I{self.include if self.own else cublas_headers_only(self.include)}"]

    def link_flags(self, origin: str | os.PathLike | None = None) -> list[str]:
        """By soname, not -lcublasLt: a wheel has no unversioned libcublasLt.so.
        RUNPATH: the folder relative to ``$ORIGIN`` (the built library's folder,
        ``origin`` here) and absolute, so a moved cache or a moved environment
        still finds it (the runner also puts ``lib`` on the child's loader path)."""
        paths = ([f"$ORIGIN/{os.path.relpath(self.lib, os.path.realpath(origin))}"] if origin else []) + [self.lib]
        return [f"-L{self.lib}", f"-l:libcublasLt.so.{self.major}", "-Xlinker", "-rpath," + ":".join(paths)]


def cublas_headers_only(include: str) -> str:
    """A folder in the cache holding links to ``include``'s cuBLAS headers
    alone, made once per ``include``."""
    folder = cache_root() / "cublas-headers" / hashlib.sha256(include.encode()).hexdigest()[:16]
    names = sorted(n for n in os.listdir(include) if n.startswith("cublas") and n.endswith(".h"))
    if folder.is_dir() and sorted(os.listdir(folder)) == names:
        return str(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=partial_prefix(folder), suffix=".tmp"))
    for name in names:
        os.symlink(os.path.join(include, name), tmp / name)
    shutil.rmtree(folder, ignore_errors=True)
    try:
        os.rename(tmp, folder)
    except OSError:  # another process made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return str(folder)


def _cublas_in(include: Path, libs: Sequence[Path], where: str, major: int | None,
               own: Path | None) -> CublasLocation | None:
    if not (include / "cublasLt.h").is_file():
        return None
    for lib in libs:
        try:
            majors = sorted((int(m.group(1)) for f in os.listdir(lib) if (m := _CUBLASLT_SO.match(f))), reverse=True)
        except OSError:
            continue
        majors = [m for m in majors if major in (None, m)]
        if majors:
            real = os.path.realpath(include)
            return CublasLocation(real, os.path.realpath(lib), majors[0], where,
                                  own is not None and real == os.path.realpath(own))
    return None


def toolkit_or_none() -> Toolkit | None:
    """``find_toolkit``'s answer, or None where there is no complete one."""
    try:
        return find_toolkit()
    except ToolchainError:
        return None


def find_cublas(toolkit: Toolkit | None = None) -> CublasLocation:
    """cuBLASLt's header and library, from one place: the toolkit beside nvcc,
    ``/usr/local/cuda``, then NVIDIA's ``nvidia-cublas`` wheel; of the
    toolkit's major release where there is one (``find_toolkit``). Raises
    ToolchainError saying how to get one."""
    toolkit = toolkit or toolkit_or_none()
    roots = ([_toolkit_of(toolkit.nvcc)] if toolkit else []) + [STANDARD_CUDA]
    candidates: list[tuple[Path, list[Path], str]] = []
    inc, libs = _TOOLKIT_CUBLAS
    for tk in roots:
        for include in (tk / inc, tk / "targets" / "x86_64-linux" / inc):
            candidates.append((include, [tk / lib for lib in libs], f"the CUDA toolkit in {tk}"))
    for root in _nvidia_wheel_roots():
        for inc, libs in _WHEEL_CUBLAS:
            candidates.append((root / inc, [root / lib for lib in libs], f"NVIDIA's nvidia-cublas wheel in {root}"))
    major = toolkit.version[0] if toolkit else None
    for include, libs, where in candidates:
        found = _cublas_in(include, libs, where, major, Path(toolkit.include) if toolkit else None)
        if found:
            return found
    of = f" for CUDA {major}" if major else ""
    raise ToolchainError(f"no cuBLASLt{of} (cublasLt.h with libcublasLt.so.N): not in the CUDA toolkit, "
                         "/usr/local/cuda or NVIDIA's wheels; pip install 'blockc[cuda]' (nvidia-cublas), "
                         "or generate with --gemm tiled")


def _emulation_include_dirs() -> list[str]:
    dirs = cuda_include_dirs()
    if not any(os.path.exists(os.path.join(d, "cuda_fp16.h")) for d in dirs):
        raise ToolchainError("no CUDA headers (cuda_fp16.h) found for the emulator: install the CUDA toolkit "
                             "or NVIDIA's wheels (pip install 'blockc[cuda]')")
    return dirs


def find_gxx() -> str | None:
    """The host C++ compiler the emulator builds with (``g++`` on PATH), or None."""
    return shutil.which("g++")


@functools.lru_cache(maxsize=None)
def sanitizer_runtime(kind: str) -> str:
    """Path of g++'s ``libasan.so``/``libtsan.so``, which a process must preload to load an
    instrumented library (the emulator's runner does)."""
    if kind not in SANITIZERS:
        raise ValueError(f"sanitize must be one of {SANITIZERS}, not {kind!r}")
    gxx = find_gxx()
    if gxx is None:
        raise ToolchainError("g++ not found")
    lib = "libasan.so" if kind == "address" else "libtsan.so"
    path = run_command([gxx, f"-print-file-name={lib}"], timeout=60).stdout.strip()
    if not os.path.isabs(path) or not os.path.exists(path):
        raise ToolchainError(f"g++ has no {lib}: install its sanitizer runtime (e.g. apt-get install libasan8 libtsan2)")
    return path


# `extern __shared__ __align__(16) float smem[];` at block or file scope.
_EXTERN_SHARED = re.compile(
    r"\bextern\s+__shared__\s+(?:(?:__align__|alignas)\s*\(\s*\w+\s*\)\s+)*"
    r"(?P<type>[A-Za-z_][\w:<>,\s\*]*?)\s*(?:__align__\s*\(\s*\w+\s*\)\s*)?"
    r"(?P<name>[A-Za-z_]\w*)\s*\[\s*\]\s*;")


def rewrite_dynamic_shared(source: str) -> str:
    """Every ``extern __shared__ T name[];`` becomes a pointer to the emulator's
    dynamic shared buffer, on the same line.

    >>> rewrite_dynamic_shared("extern __shared__ __align__(16) float smem[];")
    'static float* const smem = reinterpret_cast<float*>(blockc_emu_dynamic_shared());'
    """
    def repl(m: re.Match) -> str:
        t = " ".join(m.group("type").split())
        return f"static {t}* const {m.group('name')} = reinterpret_cast<{t}*>(blockc_emu_dynamic_shared());"
    return _EXTERN_SHARED.sub(repl, source)


# `__shared__ __align__(16) float tile[BK][BM + 1];`: one name, any dimensions.
_STATIC_SHARED = re.compile(r"\b__shared__\b[^;{}=,\[\]]*?\b(?P<name>[A-Za-z_]\w*)\s*(?:\[[^\[\];{}]*\]\s*)*;")


def declare_static_shared(source: str) -> str:
    """Every static ``__shared__`` declaration is followed, on its line, by
    ``BLOCKC_EMU_SHARED(name);`` (cuda_emu.h), which fills the variable with 0xFF
    when a block first reaches it, so that no block reads another's values, and
    shows it to the race checker.

    >>> declare_static_shared("  __shared__ float scratch[32];  // warp sums")
    '  __shared__ float scratch[32]; BLOCKC_EMU_SHARED(scratch);  // warp sums'
    """
    def repl(m: re.Match) -> str:
        if source[:m.start()].rstrip().endswith("extern"):  # dynamic: rewrite_dynamic_shared's
            return m.group(0)
        return f"{m.group(0)} BLOCKC_EMU_SHARED({m.group('name')});"
    return _STATIC_SHARED.sub(repl, source)


def rewrite_shared(source: str) -> str:
    """The source rewrites emulation needs, each keeping line numbers:
    ``rewrite_dynamic_shared`` and ``declare_static_shared``."""
    return declare_static_shared(rewrite_dynamic_shared(source))


def _c_string(text: str) -> str:
    r"""``text`` inside a C string literal: a model's name, and so its cache folder,
    may hold quotes, backslashes and newlines.

    >>> print(_c_string('say "hi"\n'))
    say \"hi\"\012
    """
    return "".join("\\" + c if c in '"\\' else c if c.isprintable() else f"\\{ord(c):03o}" for c in text)


def _prepare_sources(sources: Sequence[str | os.PathLike], build_dir: Path) -> tuple[list[str], list[str]]:
    """Sources to hand g++ (rewritten copies where needed), and -iquote flags that keep
    the originals' relative #includes working."""
    paths, quotes = [], []
    for src in sources:
        src = Path(src).resolve()
        text = src.read_text()
        rewritten = rewrite_shared(text)
        if rewritten == text:
            paths.append(str(src))
            continue
        copy = build_dir / f"{len(paths)}_{src.name}"
        copy.write_text(f'#line 1 "{_c_string(str(src))}"\n' + rewritten)
        paths.append(str(copy))
        quotes += ["-iquote", str(src.parent)]
    return paths, quotes


def _run(cmd: list[str], what: str, timeout: float) -> None:
    done = run_command(cmd, timeout=timeout)
    if done.timed_out:
        raise ToolchainError(f"g++ took longer than {timeout:.0f} s to {what}", cmd, done.stderr + done.stdout)
    if done.returncode != 0:
        raise ToolchainError(f"g++ failed to {what}", cmd, done.stderr + done.stdout)


@functools.lru_cache(maxsize=None)
def compiler_version(compiler: str) -> str:
    """``compiler --version``'s output: part of every cache key, so a new
    compiler never reuses what an old one built."""
    try:
        done = run_command([compiler, "--version"], timeout=60)
    except OSError as e:
        raise ToolchainError(f"cannot run {compiler} --version: {e}") from None
    if done.timed_out:
        raise ToolchainError(f"cannot run {compiler} --version: it took longer than 60 s")
    return f"{os.path.realpath(compiler)}\n{done.stdout}"


def emulator_files() -> list[Path]:
    """Every file of the emulator, its headers and its sources: what a build with it depends on."""
    return sorted(f for f in EMU_DIR.iterdir() if f.suffix in (".h", ".cpp"))


def _emulator_folder(compile_cmd: list[str]) -> Path:
    """Where what ``compile_cmd`` makes of the emulator's own files is cached: a
    hash of the compiler, the flags and the emulator's sources (they change with blockc only)."""
    key = hashlib.sha256()
    key.update(compiler_version(compile_cmd[0]).encode())
    key.update("\0".join(compile_cmd).encode())
    for f in emulator_files():
        key.update(f.name.encode() + f.read_bytes())
    return cache_root() / "emu" / key.hexdigest()[:24]


def _precompiled_header(compile_cmd: list[str], timeout: float) -> Path:
    """``cuda_emu.h`` precompiled with ``compile_cmd``'s flags (the kernels' own), cached
    as the runtime objects are; the header to ``-include`` (g++ reads ``cuda_emu.h.gch``
    beside it). The emulator's header was most of each model's compile: 7.6 s of a
    gpt2 model's, 2.8 s with it. Where other flags make the ``.gch`` unusable, g++
    reads the copy beside it as text (its own includes are found on ``-I``), so the
    meaning never depends on the precompiled form."""
    folder = _emulator_folder(compile_cmd)

    def make(tmp: Path) -> None:
        _run([*compile_cmd, "-x", "c++-header", str(EMU_HEADER), "-o", str(tmp)], "precompile cuda_emu.h", timeout)
    cached_file(folder / "cuda_emu.h.gch", make)
    return cached_file(folder / EMU_HEADER.name, lambda tmp: shutil.copyfile(EMU_HEADER, tmp))


def _runtime_objects(compile_cmd: list[str], timeout: float) -> list[str]:
    """The emulator's own sources compiled with ``compile_cmd``'s flags, cached
    (``files.cached_file``: built under a lock, checked before use) in ``_emulator_folder``."""
    folder = _emulator_folder(compile_cmd)
    objects = []
    for src in EMU_SOURCES:
        def make(tmp: Path, src: Path = src) -> None:
            _run([*compile_cmd, str(src), "-o", str(tmp)], f"compile {src.name}", timeout)
        objects.append(str(cached_file(folder / (src.stem + ".o"), make)))
    return objects


def compile_emulated(sources: Sequence[str | os.PathLike], out_so: str | os.PathLike, *,
                     sanitize: str | None = None, threads: bool | None = None, racecheck: bool | None = None,
                     opt: str = "-O2", extra_flags: Sequence[str] = (), timeout: float = BUILD_TIMEOUT) -> Path:
    """Build ``.cu``/``.cpp`` sources into a shared library that runs on the CPU.

    ``sanitize`` is None, ``"address"`` or ``"thread"``; a sanitizer build runs each CUDA
    thread as an OS thread (``threads`` defaults to True there, to fibers otherwise).
    ``racecheck`` (default: on unless ``sanitize``) checks every shared-memory access
    for races and reads of what the block never wrote (emu/cuda_emu_racecheck.cpp);
    it borrows g++'s ThreadSanitizer instrumentation, so no sanitizer can join it.
    ``extra_flags`` (``-DNAME``, ``-IDIR``) join the sources' command; the runtime's takes them
    less the ``-IDIR`` folders, which only the sources read.
    Sources compile in parallel; the emulator's runtime is compiled once per set of flags
    and cached (in ``files.cache_root()``: ``$BLOCKC_CACHE``, else ``~/.cache/blockc``). Raises ToolchainError with
    the compiler's output when the build fails.
    """
    gxx = find_gxx()
    if gxx is None:
        raise ToolchainError("g++ not found on PATH: the CUDA emulator needs a host C++ compiler")
    if sanitize is not None and sanitize not in SANITIZERS:
        raise ValueError(f"sanitize must be None or one of {SANITIZERS}, not {sanitize!r}")
    if threads is None:
        threads = sanitize is not None
    elif sanitize is not None and not threads:
        raise ValueError("sanitizers need threads=True: they do not understand fiber stacks")
    if racecheck is None:
        racecheck = sanitize is None
    elif racecheck and sanitize is not None:
        raise ValueError("racecheck uses g++'s -fsanitize=thread instrumentation: it cannot join a sanitizer")
    out_so = Path(out_so).resolve()
    out_so.parent.mkdir(parents=True, exist_ok=True)
    includes = [f"-I{EMU_DIR}"] + [f"-I{d}" for d in _emulation_include_dirs()]
    flags = ["-std=c++17", "-fPIC", "-pthread", opt, "-g", "-w"]
    # Fibers have 64 KiB stacks under a guard page: probe big frames page by page so an
    # overflow faults in the guard page instead of landing in a neighbour's stack.
    flags.append("-DBLOCKC_EMU_THREADS" if threads else "-fstack-clash-protection")
    if sanitize:
        flags += [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer"]
    # The kernels call __tsan_read4(addr) and the like, which the (uninstrumented)
    # runtime defines; no ThreadSanitizer is linked.
    instrument = ["-fsanitize=thread", "--param=tsan-instrument-func-entry-exit=0"] if racecheck else []
    if racecheck:
        flags.append("-DBLOCKC_EMU_RACECHECK")
    # The runtime's sources include only the emulator's headers and the system's, so the caller's include
    # folders (a model's build folder: one per model) are left out of its command, and so of its cache key:
    # with them each model compiled the whole runtime again (4 s of a tiny model's 9 s).
    own_flags = [f for f in extra_flags if not f.startswith("-I")]
    compile_cmd = [gxx, *flags, *includes, "-include", str(EMU_HEADER), *own_flags, "-x", "c++", "-c"]
    with tempfile.TemporaryDirectory(prefix="blockc-emu-src-") as tmp:
        paths, quotes = _prepare_sources(sources, Path(tmp))
        with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
            runtime = pool.submit(_runtime_objects, compile_cmd, timeout)
            header = _precompiled_header([gxx, *flags, *includes, *instrument], timeout) if paths else EMU_HEADER
            kernel_cmd = [gxx, *flags, *includes, "-include", str(header), *extra_flags, "-x", "c++", "-c"]
            jobs = [([*kernel_cmd, *instrument, *quotes, p, "-o", os.path.join(tmp, f"{i}.o")],
                     f"compile {Path(p).name}") for i, p in enumerate(paths)]
            for f in [pool.submit(_run, cmd, what, timeout) for cmd, what in jobs]:
                f.result()
            objects = [cmd[-1] for cmd, _ in jobs] + runtime.result()
        link = [gxx, "-shared", "-pthread"] + ([f"-fsanitize={sanitize}"] if sanitize else [])
        _run([*link, *objects, "-Wl,-z,defs", "-o", str(out_so)],
             f"link {out_so.name}", timeout)
    return out_so


# ---- nvcc and ptxas --------------------------------------------------------------------

@dataclass(frozen=True)
class KernelResources:
    """What ptxas reports for one kernel on one architecture."""

    name: str              # the symbol (mangled unless extern "C")
    demangled: str         # e.g. "row_sum(float const*, float*, int)"
    arch: str              # "sm_80"
    registers: int
    stack_frame_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    shared_bytes: int      # static shared memory ("smem")
    constant_bytes: int    # cmem[0]: the kernel's parameters
    barriers: int

    @property
    def short_name(self) -> str:
        """The kernel's name without namespace, template arguments or parameters."""
        head = self.demangled.split("(", 1)[0].split("<", 1)[0]
        return head.split()[-1].split("::")[-1] if head.split() else self.name


@dataclass(frozen=True)
class NvccResult:
    object_path: Path | None  # None when compile_nvcc was given no ``out``
    kernels: list[KernelResources]
    log: str

    def kernel(self, short_name: str, arch: str) -> KernelResources:
        """The report for one kernel (by ``short_name``) on one architecture."""
        for k in self.kernels:
            if k.arch == arch and (k.short_name == short_name or k.name == short_name):
                return k
        raise KeyError(f"ptxas reported no kernel {short_name!r} for {arch}")


_COMPILING = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")


def _field(pattern: str, line: str) -> int:
    m = re.search(pattern, line)
    return int(m.group(1)) if m else 0


def _demangle(names: list[str]) -> dict[str, str]:
    tool = shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


def parse_ptxas_info(log: str) -> list[KernelResources]:
    """Per-kernel, per-arch resources from ``nvcc -Xptxas -v`` output."""
    rows: dict[tuple[str, str], dict] = {}
    order: list[tuple[str, str]] = []
    arch, entry, props_for = None, None, None
    frames: dict[tuple[str, str], tuple[int, int, int]] = {}
    for line in log.splitlines():
        if m := _COMPILING.search(line):
            entry, arch = m.group(1), m.group(2)
            continue
        if m := _PROPERTIES.search(line):
            props_for = m.group(1)
            continue
        if (m := _FRAME.search(line)) and props_for and arch:
            frames[(props_for, arch)] = tuple(int(g) for g in m.groups())  # type: ignore[assignment]
            continue
        if (m := _USED.search(line)) and entry and arch:
            key = (entry, arch)
            if key not in rows:
                order.append(key)
            rows[key] = dict(registers=int(m.group(1)), shared_bytes=_field(r"(\d+) bytes smem", line),
                             constant_bytes=_field(r"(\d+) bytes cmem\[0\]", line),
                             barriers=_field(r"used (\d+) barriers", line))
    names = _demangle(sorted({name for name, _ in order}))
    result = []
    for name, a in order:
        stack, stores, loads = frames.get((name, a), (0, 0, 0))
        result.append(KernelResources(name=name, demangled=names.get(name, name), arch=a,
                                      stack_frame_bytes=stack, spill_store_bytes=stores,
                                      spill_load_bytes=loads, **rows[(name, a)]))
    return result


def compile_nvcc(source: str | os.PathLike, arch_list: Sequence[str] = DEFAULT_ARCHS, *,
                 werror: bool = True, out: str | os.PathLike | None = None,
                 extra_flags: Sequence[str] = (), timeout: float = BUILD_TIMEOUT) -> NvccResult:
    """Compile one ``.cu`` to an object for each ``sm_XX`` in ``arch_list`` with ptxas's
    verbose report; needs no GPU. ``werror`` turns every nvcc, ptxas and host-compiler
    warning into an error. ``cuda_emu.h`` is force-included, where ``BLOCKC_LAUNCH``
    expands to ``kernel<<<grid, block, shmem, stream>>>(args...)``.

    With ``out`` None the object is only a proof that the source compiles: it
    is made in a temporary folder that is removed on return (``object_path``
    is then None)."""
    if out is None:
        with tempfile.TemporaryDirectory(prefix="blockc-nvcc-") as tmp:
            result = compile_nvcc(source, arch_list, werror=werror, out=Path(tmp) / "object.o",
                                  extra_flags=extra_flags, timeout=timeout)
        return NvccResult(None, result.kernels, result.log)
    toolkit = find_toolkit()
    check_archs(toolkit.nvcc, arch_list)
    source = Path(source).resolve()
    out = Path(out)
    cmd = [toolkit.nvcc, "-c", str(source), "-o", str(out), "-std=c++17", *gencode_flags(arch_list),
           *arch_threads_flags(arch_list), *toolkit.include_flags, "-Xptxas", "-v", "-include", str(EMU_HEADER)]
    if werror:
        cmd += ["-Werror", "all-warnings", "-Xcompiler", "-Wall,-Werror"]
    cmd += list(extra_flags)
    done = run_command(cmd, timeout=timeout)
    log = done.stdout + done.stderr
    if done.timed_out:
        raise ToolchainError(f"nvcc took longer than {timeout:.0f} s", cmd, log)
    if done.returncode != 0:
        raise ToolchainError(f"nvcc failed to compile {source.name}", cmd, log)
    return NvccResult(out, parse_ptxas_info(log), log)
