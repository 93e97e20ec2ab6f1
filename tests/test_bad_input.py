"""Bad input ends in blockc's own one-line error and exit status 2, never a
traceback or a silent exit: the cases of docs/BAD-INPUT.md that
tests/test_cli.py does not already hold."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from blockc.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code, err, *needles):
    assert code == 2, err
    assert "Traceback" not in err and err.startswith("blockc: error: ")
    assert len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err


def model_file(tmp_path, source: str, name: str = "m.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return str(path)


def deny_writes_to(monkeypatch, folder):
    """A read-only folder, as os.access reports it. Tests run as root, for whom
    permission bits stop no write, so a chmod 555 folder cannot show this."""
    real = os.access
    folder = os.path.abspath(folder)
    monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: False if (
        mode & os.W_OK and os.path.abspath(p) == folder) else real(p, mode, *a, **k))


# ---- where the output goes -------------------------------------------------------------------
def test_export_into_a_read_only_folder(tmp_path, monkeypatch, capsys):
    deny_writes_to(monkeypatch, tmp_path)
    code, out, err = run(capsys, "export", "tiny", "--set", "layers=1", "-o", str(tmp_path / "m.onnx"))
    one_line_error(code, err, f"cannot write {tmp_path / 'm.onnx'}: the folder {tmp_path} is not writable")
    assert out == "" and list(tmp_path.iterdir()) == []


def test_export_under_a_file(tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    code, _, err = run(capsys, "export", "tiny", "-o", str(tmp_path / "afile" / "m.onnx"))
    one_line_error(code, err, f"{tmp_path / 'afile'} is a file, not a folder")


def test_cuda_into_a_read_only_folder(tmp_path, monkeypatch, capsys):
    deny_writes_to(monkeypatch, tmp_path)
    code, _, err = run(capsys, "cuda", "tiny", "--set", "layers=1", "--no-compile", "-o", str(tmp_path / "build"))
    one_line_error(code, err, f"the folder {tmp_path} is not writable")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("target", ["afile", "afile/build"])
def test_cuda_onto_an_existing_file(target, tmp_path, capsys):
    (tmp_path / "afile").write_text("keep me")
    code, _, err = run(capsys, "cuda", "tiny", "--set", "layers=1", "--no-compile", "-o", str(tmp_path / target))
    one_line_error(code, err, "is a file, not a folder")
    assert (tmp_path / "afile").read_text() == "keep me"


def _fail_to_compile(source, *_args, **_kwargs):
    from blockc.codegen.cuda.toolchain import ToolchainError
    raise ToolchainError("nvcc failed to compile model.cu", ["nvcc", str(source)], f"{source}(1): error: made up")


def test_a_cuda_build_that_does_not_compile_errs_on_stderr_and_leaves_no_folder(tmp_path, monkeypatch, capsys):
    from blockc.codegen.cuda import toolchain
    if toolchain.find_nvcc().path is None:
        pytest.skip("no nvcc")
    monkeypatch.setattr(toolchain, "compile_nvcc", _fail_to_compile)
    code, out, err = run(capsys, "cuda", "tiny", "--set", "layers=1", "-o", str(tmp_path / "build" / "b"))
    assert code == 2 and out == "" and err.startswith("blockc: error: nvcc failed to compile model.cu"), (out, err)
    assert "model.cu(1): error: made up" in err and "Traceback" not in err
    # nvcc's lines name the file where the user asked for it, not the hidden folder that is gone
    assert f"{tmp_path / 'build' / 'b' / 'model.cu'}(1): error" in err and ".tmp" not in err, err
    assert list(tmp_path.iterdir()) == []    # not b, not build/, not a temporary folder


def test_a_failed_cuda_build_leaves_the_previous_build_whole(tmp_path, monkeypatch, capsys):
    from blockc.codegen.cuda import toolchain
    if toolchain.find_nvcc().path is None:
        pytest.skip("no nvcc")
    build = tmp_path / "b"
    assert run(capsys, "cuda", "tiny", "--set", "layers=1", "--no-compile", "-o", str(build))[0] == 0
    before = {p.name: p.read_bytes() for p in build.iterdir()}
    monkeypatch.setattr(toolchain, "compile_nvcc", _fail_to_compile)
    assert run(capsys, "cuda", "tiny", "--set", "layers=1", "--set", "d_model=32", "-o", str(build))[0] == 2
    assert {p.name: p.read_bytes() for p in build.iterdir()} == before and list(tmp_path.iterdir()) == [build]


def test_ctrl_c_during_cuda_leaves_no_partial_build(tmp_path, monkeypatch, capsys):
    from blockc.report import cuda_summary

    def interrupted(*_args, **_kwargs):   # weights.bin is written by now
        raise KeyboardInterrupt
    monkeypatch.setattr(cuda_summary, "compile_report", interrupted)
    code, _, err = run(capsys, "cuda", "tiny", "--set", "layers=1", "-o", str(tmp_path / "b"))
    assert code == 130 and "interrupted" in err
    assert list(tmp_path.iterdir()) == []


def test_a_failed_compare_leaves_no_report_folder(tmp_path, capsys):
    code, _, err = run(capsys, "compare", "nosuch", "--report", str(tmp_path / "r" / "report"))
    one_line_error(code, err, "unknown model 'nosuch'")
    assert list(tmp_path.iterdir()) == []


def test_json_report_into_a_missing_folder_is_refused_before_the_work(tmp_path, capsys):
    code, out, err = run(capsys, "fusions", "tiny", "--no-onnx-forms", "--json", str(tmp_path / "no" / "r.json"))
    one_line_error(code, err, "does not exist")
    assert out == ""


@pytest.mark.parametrize("backend", ["cuda-emu", "ort-cpu"])   # the CUDA builds and the compile cache
@pytest.mark.parametrize("variable", ["BLOCKC_CACHE", "HOME"])
def test_unwritable_cache_or_home(variable, backend, tmp_path, monkeypatch, capsys):
    afile = tmp_path / "afile"
    afile.write_text("")
    for name in ("BLOCKC_CACHE", "BLOCKC_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, str(afile))
    code, _, err = run(capsys, "run", "tiny", "--set", "layers=1", "--backend", backend)
    one_line_error(code, err, str(afile))


def test_a_cache_on_a_filesystem_without_flock(tmp_path, monkeypatch, capsys):
    """flock(2) failing as on NFS with no lock manager (ENOLCK): the lock
    file named, and what to do, rather than the bare strerror."""
    import errno
    import fcntl

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setenv("BLOCKC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(fcntl, "flock", no_locks)
    code, _, err = run(capsys, "run", "tiny", "--set", "layers=1", "--form", "fused")
    one_line_error(code, err, f"cannot lock {tmp_path / 'cache'}", ".lock: No locks available (its filesystem "
                   "gives no working flock; set BLOCKC_CACHE to a folder on a local disk)")


# ---- options -----------------------------------------------------------------------------------
@pytest.mark.parametrize("arch, message", [
    ("sm_xx", "'sm_xx' is not a GPU architecture"),
    ("sm_80,90", "'90' is not a GPU architecture"),
    ("sm_80;touch /tmp/x", "'sm_80;touch /tmp/x' is not a GPU architecture"),
    (",", "no architecture given"),
])
def test_bad_arch(arch, message, tmp_path, capsys):
    code, _, err = run(capsys, "cuda", "tiny", "--no-compile", "--arch", arch, "-o", str(tmp_path / "b"))
    one_line_error(code, err, f"--arch {arch}: {message}", "e.g. --arch sm_80,sm_90")
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("arch", ["sm_12", "sm_999", "sm_80a"])
def test_an_arch_the_nvcc_in_use_cannot_build_for(arch, tmp_path, capsys):
    from blockc.codegen.cuda import toolchain
    nvcc = toolchain.find_nvcc().path
    if nvcc is None:
        pytest.skip("no nvcc")
    code, out, err = run(capsys, "cuda", "tiny", "--arch", f"sm_80,{arch}", "-o", str(tmp_path / "b"))
    one_line_error(code, err, f"--arch {arch}: {nvcc} (CUDA ", "cannot build for it; it builds for sm_", "sm_90")
    assert "nvcc fatal" not in err and out == "" and list(tmp_path.iterdir()) == []


def test_negative_d_ff_is_a_setting_error_not_blamed_on_the_script(capsys):
    code, _, err = run(capsys, "show", "tiny", "--set", "d_ff=-5")
    one_line_error(code, err, "tiny: d_ff must be positive, or 0 for 4*d_model, got -5")
    assert "bin/blockc" not in err and "runpy" not in err and ".py:" not in err


def test_weights_too_big_for_memory_are_refused_with_their_size(capsys):
    code, _, err = run(capsys, "run", "tiny", "--set", "vocab=10000000000000", "--backend", "reference")
    one_line_error(code, err, "tiny's weights would take 2.27 PiB (640,000,000,108,288 parameters as float32)",
                   "of memory available")


def test_weights_over_the_available_memory(monkeypatch, capsys):
    from blockc.frontends import module
    # a vocabulary big enough that the weights, not the graph (about 1 MiB traced), are what cannot fit
    monkeypatch.setattr(module, "available_memory", lambda: 1 << 22)
    code, _, err = run(capsys, "run", "tiny", "--set", "vocab=100000", "--backend", "reference")
    one_line_error(code, err, "tiny's weights would take 24.8 MiB (6,508,288 parameters as float32), more than "
                   "the 4 MiB of memory available")
    # a weight made alone is held to the same rule (the Python API makes them lazily)
    import blockc
    weights = blockc.init_weights(blockc.build_model("tiny"))
    monkeypatch.setattr(module, "available_memory", lambda: 1 << 17)
    with pytest.raises(module.ModelError, match=r"weight 'tok.weight' \[256, 64\] would take 192 KiB"):
        weights["tok.weight"]


# gpt2 with 1,000 layers (16,004 parameters) and 64 MiB of memory: too big a graph, and quick to build
GRAPH_TOO_BIG = ("gpt2 with 1,000 layers would need about 469 MiB to trace and export (the IR and the ONNX graph, "
                 "~480 KiB a layer), more than the 64 MiB of memory available")


def no_tracing(monkeypatch):
    """Memory as if 64 MiB were free, and a test failure if tracing begins."""
    from blockc.frontends import module
    monkeypatch.setattr(module, "available_memory", lambda: 64 << 20)

    def tracing(graph):
        raise AssertionError("tracing began: the graph should have been refused before it")
    monkeypatch.setattr(module, "tracing", tracing)


@pytest.mark.parametrize("command", [
    ["show"], ["export", "--no-weights", "-o", "OUT/m.onnx"], ["run", "--backend", "reference"],
    ["fusions", "--no-onnx-forms"], ["check", "--backend", "reference"], ["cuda", "--no-compile", "-o", "OUT/b"],
    ["compare", "--backends", "reference", "--peers", "none"],
])
def test_a_graph_too_big_for_memory_is_refused_before_tracing(command, tmp_path, monkeypatch, capsys):
    no_tracing(monkeypatch)
    argv = [a.replace("OUT", str(tmp_path)) for a in command]
    code, out, err = run(capsys, argv[0], "gpt2", "--set", "layers=1000", *argv[1:])
    one_line_error(code, err, GRAPH_TOO_BIG, "make it smaller with --set")
    assert out == "" and list(tmp_path.iterdir()) == []


def test_summary_of_a_graph_too_big_to_trace_still_counts_it(monkeypatch, capsys):
    no_tracing(monkeypatch)  # summary counts the module tree; it never traces
    code, out, _ = run(capsys, "summary", "gpt2", "--set", "layers=1000")
    d = 768
    total = (50257 + 1024) * d + 1000 * (12 * d * d + 13 * d) + 2 * d  # tables, blocks, the final norm
    assert code == 0 and out.startswith(f"gpt2 (DecoderLM): {total:,} parameters")


def test_a_graph_that_fits_is_traced(monkeypatch):
    import blockc
    from blockc.frontends import module
    model = blockc.build_model("tiny")
    need = module.graph_nbytes(model)
    assert need == 36 * module.GRAPH_BYTES_PER_PARAMETER  # 2 blocks of 16, two tables, the final norm's 2
    monkeypatch.setattr(module, "available_memory", lambda: need)
    assert len(blockc.trace(model).nodes) == 75
    monkeypatch.setattr(module, "available_memory", lambda: need - 1)
    with pytest.raises(module.ModelError, match=r"^tiny with 2 layers would need about 1.05 MiB to trace"):
        blockc.trace(model)
    monkeypatch.setattr(module, "available_memory", lambda: None)  # unknown: nothing to refuse on
    assert len(blockc.trace(model).nodes) == 75


def test_a_graph_too_big_from_a_model_without_layers_names_its_parameters(tmp_path, monkeypatch, capsys):
    no_tracing(monkeypatch)
    path = model_file(tmp_path, """
        import blockc
        from blockc.frontends import InputSpec, Linear, ModuleList
        from blockc.ir.dtypes import DType
        class Deep(blockc.Model):
            def __init__(self):
                super().__init__()
                self.steps = ModuleList([Linear(8, 8) for _ in range(2000)])
            def inputs(self):
                return [InputSpec("x", DType.float32, (2, 8))]
            def forward(self, x):
                for step in self.steps:
                    x = step(x)
                return x
    """)
    code, _, err = run(capsys, "show", f"{path}:Deep")
    one_line_error(code, err, "model would need about 117 MiB to trace and export (the IR and the ONNX graph, "
                   "~30 KiB for each of its 4,000 parameter tensors), more than the 64 MiB of memory available")


def test_a_shape_past_int64_is_refused(capsys):
    code, _, err = run(capsys, "show", "tiny", "--set", "vocab=" + "9" * 30)
    one_line_error(code, err, "more than any tensor can hold")


def relu_file(tmp_path, shape) -> str:
    """An ONNX file ``y = Relu(x)`` whose input ``x`` has ``shape`` (ints or dim names)."""
    from onnx import TensorProto, helper, save
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "big", [x], [y])
    path = str(tmp_path / "big.onnx")
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return path


BIG = 2**62


@pytest.mark.parametrize("shape, dims, message", [
    ([BIG, BIG], [], f"input 'x' f32[{BIG},{BIG}] has 2.13e+37 elements of 4 bytes, more than any tensor can hold"),
    (["n", BIG], ["--dim", "n=2"], f"input 'x' f32[n,{BIG}] at n=2 is [2, {BIG}] and has 9.22e+18 elements"),
])
@pytest.mark.parametrize("command", [["run", "--backend", "reference"], ["compare", "--backends", "reference"]])
def test_an_onnx_input_past_int64_is_refused_naming_it(command, shape, dims, message, tmp_path, capsys):
    """Not numpy's traceback when the input is sampled, nor a memory plan in
    zettabytes: every command that binds the dims refuses such a tensor."""
    code, out, err = run(capsys, command[0], relu_file(tmp_path, shape), *command[1:], *dims)
    one_line_error(code, err, message)
    assert "EiB" not in err and out == ""


@pytest.mark.parametrize("argv", [["run", "tiny", "--dim", f"batch={2**45}", "--dim", "seq=128"],
                                  ["compare", "tiny", "--batch", str(2**45)]])
def test_sizes_whose_intermediate_passes_int64_are_refused_naming_it(argv, capsys):
    # the ids and embeddings fit (2**55, 2**60 bytes); the attention scores [batch, heads, seq, seq] do not
    code, out, err = run(capsys, *argv, "--set", "layers=1")
    one_line_error(code, err, f"the output of matmul f32[batch,4,seq,seq] at batch={2**45}, seq=")


# ---- model files -------------------------------------------------------------------------------
def test_model_class_without_inputs(tmp_path, capsys):
    path = model_file(tmp_path, """
        import blockc
        class M(blockc.Model):
            def forward(self, x):
                return x
    """)
    code, _, err = run(capsys, "show", f"{path}:M")
    one_line_error(code, err, "M defines no inputs(): a Model declares its graph inputs")


MODEL = textwrap.dedent("""
    import sys
    import blockc
    from blockc.frontends import InputSpec
    from blockc.ir.dtypes import DType
    class M(blockc.Model):
        def inputs(self):
            return [InputSpec("x", DType.float32, (2, 4))]
        def forward(self, x):
            return x.exp()
""")


@pytest.mark.parametrize("where, code_line, line, message", [
    ("load", "sys.exit(3)", 11, "the model file called sys.exit(3) while loading"),
    ("load", "sys.exit(0)", 11, "the model file called sys.exit(0) while loading"),
    ("build", "def build():\n    sys.exit(3)", 12, "build called sys.exit(3)"),
    ("forward", "class Bad(M):\n    def forward(self, x):\n        sys.exit(3)", 13,
     "Bad.inputs()/forward() called sys.exit(3)"),
    ("forward", "class Bad(M):\n    def forward(self, x):\n        return x.nope", 13,
     "error in Bad.inputs()/forward(): AttributeError: 'Tensor' object has no attribute 'nope'"),
    ("inputs", "class Bad(M):\n    def inputs(self):\n        return 1 / 0", 13,
     "error in Bad.inputs()/forward(): ZeroDivisionError: division by zero"),
])
def test_model_file_that_exits_or_raises(where, code_line, line, message, tmp_path):
    """In a process of its own: sys.exit must not end blockc with the model's status."""
    path = model_file(tmp_path, MODEL + code_line + "\n")
    name = {"load": "M", "build": "build", "forward": "Bad", "inputs": "Bad"}[where]
    proc = subprocess.run([sys.executable, "-m", "blockc.cli", "show", f"{path}:{name}"], capture_output=True,
                          text=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    one_line_error(proc.returncode, proc.stderr, f"{path}:{line}: {message}")
    assert proc.stdout == ""


# ---- names are shown, not interpreted -----------------------------------------------------------
def test_printable():
    from blockc.errors import printable
    assert printable("\x1b[31mred\n") == "\\x1b[31mred\\n"
    assert printable("a\nb\x1b\t\u202e\x9b", keep_newlines=True) == "a\nb\\x1b\\t\\u202e\\x9b"
    assert printable("blocks.0.attn.w_q.weight — ok") == "blocks.0.attn.w_q.weight — ok"


@pytest.mark.parametrize("ext", ["safetensors", "npz"])
def test_weight_names_are_escaped(ext, tmp_path, capsys):
    import blockc
    from blockc.frontends.weights import save_weights
    weights = dict(blockc.init_weights(blockc.build_model("tiny", {"layers": "1"})))
    weights["\x1b[31mred\nfake: line"] = np.zeros(3, np.float32)
    weights["\x1b[31mred\n" + "tok.weight"] = weights.pop("tok.weight")
    path = tmp_path / f"w.{ext}"
    save_weights(path, weights)
    code, _, err = run(capsys, "run", "tiny", "--set", "layers=1", "--backend", "reference", "--weights", str(path))
    assert code == 2 and "\x1b" not in err and "Traceback" not in err
    lines = err.strip().splitlines()
    assert lines[0] == "blockc: error: weights do not match 'tiny' (3 problems):"
    assert sorted(lines[1:]) == sorted(["  missing: tok.weight (f32[256,64])",
                                        "  unexpected: \\x1b[31mred\\nfake: line",
                                        "  unexpected: \\x1b[31mred\\ntok.weight"])


def test_error_messages_are_escaped_where_they_are_printed(tmp_path, capsys):
    path = model_file(tmp_path, "raise ValueError('\\x1b[2J\\x1b[31mcleared')\n")
    code, _, err = run(capsys, "show", f"{path}:M")
    one_line_error(code, err, "ValueError: \\x1b[2J\\x1b[31mcleared")
    assert "\x1b" not in err


# ---- the modern decoder's settings and inputs (llama-tiny: 4 heads of 16, 2 K/V heads, rope) ----------
@pytest.mark.parametrize("argv, message", [
    (["show", "llama-tiny", "--set", "kv_heads=3"],
     "llama-tiny: heads=4 is not divisible by kv_heads=3: each key/value head serves a whole group"),
    (["show", "llama-tiny", "--set", "kv_heads=-1"],
     "llama-tiny: kv_heads must be positive, or 0 for as many as heads"),
    (["show", "llama-tiny", "--set", "rotary_dim=7"],
     "llama-tiny: rotary_dim=7 must be a positive even number: RoPE turns pairs of dimensions"),
    (["show", "llama-tiny", "--set", "rotary_dim=32"], "llama-tiny: rotary_dim=32 is more than the head size 16"),
    (["show", "llama-tiny", "--set", "head_dim=15"],
     "llama-tiny: the head size 15 is odd, and RoPE turns pairs of dimensions: set rotary_dim to an even number"),
    (["show", "gpt2", "--set", "rotary_dim=8"], "gpt2: rotary_dim=8 applies to positions=rope, not learned"),
    (["show", "llama-tiny", "--set", "rope_form=gptj"],
     "llama-tiny: rope_form must be one of rotate_half, interleaved, got 'gptj'"),
    (["show", "llama-tiny", "--set", "rope_theta=nan"], "llama-tiny: rope_theta must be a positive finite number"),
    (["show", "llama-tiny", "--set", "qk_norm=both"],
     "llama-tiny: qk_norm must be one of none, head, full, got 'both'"),
    (["show", "llama-tiny", "--set", "positions=alibi"],
     "llama-tiny: positions must be one of learned, sinusoidal, rope, got 'alibi'"),
])
def test_bad_modern_settings(argv, message, capsys):
    one_line_error(*run(capsys, *argv)[::2], message)


def test_positions_past_the_rotary_table_are_refused(tmp_path, capsys):
    path = tmp_path / "in.npz"
    positions = np.arange(4)[None].repeat(2, 0)
    positions[1, 3] = 128   # llama-tiny's tables have 128 rows
    np.savez(path, input_ids=np.zeros((2, 4), np.int64), position_ids=positions)
    code, _, err = run(capsys, "run", "llama-tiny", "--inputs", str(path))
    assert code == 2 and err.startswith("blockc: error: ") and "Traceback" not in err   # the list of problems
    assert "input 'position_ids': 1 of 8 ids out of range [0, 128) (min 0, max 128; it indexes 'rope.cos'" in err
