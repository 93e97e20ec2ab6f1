"""The command line: every command, its --help, and clean errors for bad input."""
import io
import json
import os
import re
import stat
import subprocess
import sys
import threading

import numpy as np
import pytest

from blockc.cli import build_parser, main

COMMANDS = ["models", "show", "summary", "export", "run", "fusions", "check", "cuda", "compare", "generate", "cache"]


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command", COMMANDS)
def test_help_says_what_each_command_does(command, capsys):
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) > 3
    sub = build_parser()._subparsers._group_actions[0].choices[command]
    assert sub.description and sub.description.split()[0] in out


def test_models_lists_builtins(capsys):
    code, out, _ = run(capsys, "models")
    assert code == 0
    for name in ("tiny", "gpt2", "bert-base", "gpt2-block", "llama-tiny", "qwen3-tiny"):
        assert f"\n{name}" in "\n" + out
    assert "layers=12" in out and "vocab=50257" in out
    llama = out.split("\nllama-tiny")[1].split("\nqwen3-tiny")[0]
    for setting in ("kv_heads=2", "positions=rope", "gated_ffn=True", "activation=silu", "norm=rmsnorm",
                    "tie_embeddings=False", "qkv_bias=False", "qk_norm=none"):
        assert setting in llama
    assert "qk_norm=head" in out.split("\nqwen3-tiny")[1]


def test_set_overrides_the_modern_settings(capsys):
    from blockc import parse_graph
    code, out, err = run(capsys, "show", "llama-tiny", "--set", "layers=1", "--set", "kv_heads=1",
                         "--set", "rope_form=interleaved", "--set", "rotary_dim=8", "--set", "rope_theta=500")
    assert code == 0, err
    g = parse_graph(out)
    assert [tuple(g.params[f"blocks.0.attn.w_{p}.weight"].shape) for p in "qkv"] == [(64, 64), (64, 16), (64, 16)]
    assert tuple(g.params["rope.cos"].shape) == (128, 8)
    assert [v.name for v in g.inputs] == ["input_ids", "position_ids"]


def test_show_prints_parsable_ir(capsys):
    from blockc import parse_graph
    code, out, _ = run(capsys, "show", "tiny", "--set", "layers=1", "--form", "decomposed")
    assert code == 0
    g = parse_graph(out)
    assert "layernorm" not in g.op_counts() and "reduce_mean" in g.op_counts()


def test_run_reference_with_check(capsys):
    code, out, _ = run(capsys, "run", "tiny", "--backend", "reference", "--check", "--dim", "seq=7")
    assert code == 0
    assert "logits" in out and "[2, 7, 256]" in out and "max |err| vs f64" in out


@pytest.mark.parametrize("argv, message", [
    (["show", "nope"], "unknown model 'nope'"),
    (["show", "gpt2", "--set", "colour=blue"], "gpt2 has no setting 'colour'"),
    (["show", "gpt2", "--set", "layers"], "malformed --set 'layers'"),
    (["show", "gpt2", "--set", "layers=two"], "--set layers='two' is not a valid int"),
    (["show", "gpt2", "--set", "heads=7"], "d_model=768 is not divisible by heads=7"),
    (["run", "tiny", "--backend", "reference", "--dim", "seq=500"], "exceeds the model's maximum of 128"),
    (["run", "tiny", "--backend", "reference", "--dim", "seq=x"], "malformed --dim"),
    (["run", "tiny", "--backend", "reference", "--dim", "heads=3"], "no such dimension"),
    (["show", "missing_file.py:build"], "not found"),
])
def test_bad_input_is_a_clean_error(argv, message, capsys):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert message in err and "Traceback" not in err


def test_console_script_entry_point_runs():
    proc = subprocess.run([sys.executable, "-m", "blockc.cli", "show", "gpt2", "--set", "heads=7"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.startswith("blockc: error:") and "Traceback" not in proc.stderr


def value_option(command: str) -> list[str]:
    """``command``'s first option that takes a value, given none: argparse's
    own error, raised by the command's parser (none: an unknown flag)."""
    parser = build_parser()._subparsers._group_actions[0].choices[command]
    for action in parser._actions:
        if action.option_strings and action.nargs is None and action.const is None and not action.choices:
            return [command, action.option_strings[-1]]
    return [command, "--no-such-flag"]


@pytest.mark.parametrize("command", COMMANDS)
def test_an_argument_error_is_one_line_on_every_command(command, capsys):
    code, out, err = run(capsys, *value_option(command))
    assert code == 2 and err.startswith("blockc: error: ") and err.count("\n") == 1, err
    assert "usage:" not in err and f"blockc {command}: error" not in err


def blockc_stderr(*argv, cwd=None) -> tuple[int, str]:
    """The exit status and standard error of the real program: what ONNX
    Runtime writes from C++ goes there too, past pytest's capture."""
    proc = subprocess.run([sys.executable, "-m", "blockc.cli", *argv], capture_output=True, text=True, cwd=cwd)
    return proc.returncode, proc.stderr


def test_the_program_says_an_argument_error_in_one_line():
    code, err = blockc_stderr("generate", "tiny", "--max-new", "x")
    assert code == 2
    assert err == "blockc: error: argument --max-new: invalid int value: 'x' (see blockc generate --help)\n"


def test_an_onnx_runtime_failure_is_blockcs_one_line_alone(tmp_path):
    """A gather out of range on ONNX Runtime: its error, said once by blockc,
    with no coloured log line of ONNX Runtime's before it."""
    import onnx
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 3])
    idx = helper.make_tensor_value_info("idx", TensorProto.INT64, [1, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("GatherND", ["x", "idx"], ["y"])], "g", [x, idx], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8   # onnxruntime reads at most 13; onnx writes 14
    onnx.save(model, str(tmp_path / "gather.onnx"))
    np.savez(tmp_path / "bad.npz", x=np.zeros((2, 4, 3), np.float32), idx=np.array([[0, 4]], np.int64))
    code, err = blockc_stderr("run", "gather.onnx", "--backend", "ort", "--inputs", "bad.npz", cwd=tmp_path)
    assert code == 2 and err.startswith("blockc: error: onnxruntime failed to run the model: ")
    assert "out of data bounds" in err and err.count("\n") == 1, err


# ---- output paths that are not regular files -----------------------------------
# Each flag that names an output file: the command line, and how to read what it wrote.
OUTPUT_FLAGS = {
    "--save": (["run", "tiny", "--set", "layers=1", "--backend", "reference", "--dim", "seq=4", "--save"],
               lambda data: np.load(io.BytesIO(data))["logits"].shape == (2, 4, 256)),
    "--json": (["fusions", "tiny", "--set", "layers=1", "--no-onnx-forms", "--json"],
               lambda data: json.loads(data)["model"] == "tiny"),
    "-o": (["export", "tiny", "--set", "layers=1", "-o"],
           lambda data: len(__import__("onnx").load_from_string(data).graph.node) > 0),
}


def null_device(path) -> None:
    """A private /dev/null (char device 1, 3) at ``path``: a test that failed
    on the real one would leave every process on the machine a regular file."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, OSError) as e:
        pytest.skip(f"cannot make a device node here: {e}")


def read_fifo_in_background(path):
    """A thread reading the FIFO at ``path`` to its end; returns (thread, chunks)."""
    chunks = []

    def read():
        with open(path, "rb") as f:
            chunks.append(f.read())
    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread, chunks


@pytest.mark.parametrize("flag", OUTPUT_FLAGS)
def test_an_output_onto_a_symlink_writes_where_it_leads(flag, tmp_path, capsys):
    argv, readable = OUTPUT_FLAGS[flag]
    (tmp_path / "elsewhere").mkdir()
    target, link = tmp_path / "elsewhere" / "out.file", tmp_path / "link.file"
    link.symlink_to(target)
    code, _, err = run(capsys, *argv, str(link))
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == str(target)   # the link is left a link
    assert readable(target.read_bytes())
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.file"]   # nothing else beside it


@pytest.mark.parametrize("flag", OUTPUT_FLAGS)
def test_an_output_onto_a_fifo_is_written_through(flag, tmp_path, capsys):
    argv, readable = OUTPUT_FLAGS[flag]
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    thread, chunks = read_fifo_in_background(fifo)
    code, _, err = run(capsys, *argv, str(fifo))
    thread.join(timeout=10)
    assert code == 0, err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced by a regular file"
    assert not thread.is_alive() and readable(chunks[0])


@pytest.mark.parametrize("flag", OUTPUT_FLAGS)
def test_an_output_onto_a_device_is_written_through(flag, tmp_path, capsys):
    """``--save /dev/null`` once made /dev/null a 66 KB regular file (run as root)."""
    argv, _ = OUTPUT_FLAGS[flag]
    null = tmp_path / "null"
    null_device(null)
    code, _, err = run(capsys, *argv, str(null))
    assert code == 0, err
    assert stat.S_ISCHR(os.lstat(null).st_mode) and os.lstat(null).st_rdev == os.makedev(1, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"]


def fused_counts(report):
    return {k: c["fused"] for k, c in report["counts"].items() if c["category"] == "fusion"}


@pytest.mark.parametrize("form", ["standard", "decomposed"])
def test_fusions_report_counts_gpt2(form, tmp_path, capsys):
    import json
    path = tmp_path / "r.json"
    # gpt2's structure at 4 layers; narrow and a small vocabulary: the ONNX forms are worked out
    # by exporting seeded weights, some 68M floats at gpt2's own width, and no count depends on them
    code, out, _ = run(capsys, "fusions", "gpt2", "--set", "layers=4", "--set", "d_model=64", "--set", "heads=4",
                       "--set", "vocab=512", "--form", form, "--json", str(path))
    assert code == 0
    report = json.loads(path.read_text())
    assert report["schema"] == "blockc.fusion-report/1"
    counts = fused_counts(report)
    assert counts["add_layernorm"] == 9 and counts["masked_softmax"] == 4 and counts["qkv"] == 4
    assert report["nodes"]["after"] < report["nodes"]["before"]
    assert report["traffic_bytes"]["after"] < report["traffic_bytes"]["before"]
    fused = [s for s in report["sites"] if s["status"] == "fused" and s["kind"] == "add_layernorm"]
    assert all(s["nodes"] and s["result"] == "add_layernorm" for s in fused)
    assert "add_layernorm" in out and "modelled memory traffic" in out


def test_fusions_report_counts_bert(tmp_path, capsys):
    import json
    path = tmp_path / "r.json"
    assert run(capsys, "fusions", "bert-base", "--set", "layers=2", "--json", str(path))[0] == 0
    counts = fused_counts(json.loads(path.read_text()))
    assert counts["add_layernorm"] == 5 and counts["masked_softmax"] == 2


def test_fusions_disable_and_reasons(capsys):
    code, out, _ = run(capsys, "fusions", "tiny", "--disable", "fuse_attention", "--verbose")
    assert code == 0
    assert "rejected masked_softmax" in out and "a plain softmax: no scale or mask to fuse" in out
    table = out.split("fusion")[1].split("\n\n")[0]
    assert not re.search(r"^\s+attention\s", table, re.M)
    # and nothing builds on the attention op it would have made
    assert re.search(r"^\s+qkv_attention\s+0\s", table, re.M)


def test_print_after_and_unknown_pass(capsys):
    code, out, err = run(capsys, "show", "tiny", "--form", "fused", "--print-after", "fuse_masked_softmax")
    assert code == 0 and "after fuse_masked_softmax" in err and "masked_softmax" in err
    code, _, err = run(capsys, "show", "tiny", "--form", "fused", "--disable", "fuse_everything")
    assert code == 2 and "unknown pass 'fuse_everything'" in err


def test_check_passes_and_fails(capsys, monkeypatch):
    code, out, _ = run(capsys, "check", "tiny", "--backend", "reference")
    assert code == 0 and out.strip().endswith("PASS")
    # Break the fused softmax's meaning: check must fail and name the diverging value.
    from blockc.ops import registry
    opdef = registry.get("masked_softmax")
    good = opdef.numpy_fn
    monkeypatch.setattr(opdef, "numpy_fn", lambda xs, attrs, env: good(xs, attrs, env) * 1.001)
    code, out, _ = run(capsys, "check", "tiny", "--backend", "reference")
    assert code == 1 and "FAIL" in out
    assert "first divergence at" in out and "(softmax), now computed by masked_softmax" in out


@pytest.mark.parametrize("name", ["tiny", "gpt2", "gpt2-block", "bert-base", "llama-tiny", "qwen3-tiny"])
def test_check_passes_for_every_model_in_every_form(name, capsys):
    sets = ["--set", "layers=2", "--set", "d_model=32", "--set", "heads=4"]
    if name in ("gpt2", "bert-base", "tiny", "llama-tiny", "qwen3-tiny"):
        sets += ["--set", "vocab=50"]
    code, out, _ = run(capsys, "check", name, *sets, "--dim", "seq=9")
    assert code == 0, out
    for form in ("function", "contrib", "onnx23", "auto"):
        assert f"--fused-as {form}" in out
    assert out.count("PASS") == 5 and "FAIL" not in out


@pytest.mark.parametrize("name", ["llama-tiny", "qwen3-tiny"])
def test_fusions_give_every_site_that_does_not_fuse_a_reason(name, tmp_path, capsys):
    import json
    path = tmp_path / "r.json"
    assert run(capsys, "fusions", name, "--json", str(path))[0] == 0
    report = json.loads(path.read_text())
    # per layer: Q/K/V merged and SwiGLU's gate/up merged (fuse_qkv takes any sibling projections),
    # the queries' and the keys' rotary embeddings, the attention core, and the residual add into
    # the next RMSNorm (block 0's first norm reads no add); cache_attention and append_attention need a
    # decode graph's cache: none in the plain forward; grouped_attention (fuse_repeat_kv) finds K/V
    # repeated per query head only in exported graphs: the DSL groups its heads itself; SwiGLU's silu
    # is an activation site that finds no bias to fuse (its input is the merged gate/up's split)
    assert fused_counts(report) == {"qkv": 4, "rotary": 4, "masked_softmax": 2, "attention": 2,
                                    "grouped_attention": 0, "cache_attention": 0, "append_attention": 0,
                                    "qkv_attention": 0,
                                    "add_rmsnorm": 4, "bias_activation": 0}
    rejected = [s for s in report["sites"] if s["status"] != "fused"]
    assert rejected and all(s["reason"] for s in rejected)
    # the packed projection + attention fusion declines the grouped heads, and says so, once per layer
    grouped = [s for s in rejected if s["kind"] == "qkv_attention" and s["reason"] == (
        "grouped-query attention (2 K/V heads, each shared by 2 query heads): qkv_attention takes one K/V "
        "head per query head")]
    assert len(grouped) == 2 and all(s["near_miss"] for s in grouped)


def test_llama_tiny_runs_on_emulated_cuda(capsys):
    from blockc.codegen.cuda import toolchain
    if toolchain.find_gxx() is None:
        pytest.skip("g++ not found")
    code, out, err = run(capsys, "run", "llama-tiny", "--backend", "cuda-emu", "--form", "fused", "--check",
                         "--dim", "seq=9", "--dim", "batch=2")
    assert code == 0, err + out
    assert "max |err| vs f64" in out and "[2, 9, 256]" in out


def test_fusions_report_names_the_onnx_form(tmp_path, capsys):
    import json
    path = tmp_path / "r.json"
    assert run(capsys, "fusions", "tiny", "--fused-as", "contrib", "--json", str(path))[0] == 0
    sites = [s for s in json.loads(path.read_text())["sites"] if s["status"] == "fused"
             and s["kind"] == "add_layernorm"]
    assert sites and all(s["onnx_form"] == "contrib" for s in sites)


def test_export_fused_as(tmp_path, capsys):
    import onnx
    out = tmp_path / "m.onnx"
    assert run(capsys, "export", "tiny", "--form", "fused", "--fused-as", "contrib", "-o", str(out))[0] == 0
    ops = {(n.domain, n.op_type) for n in onnx.load(str(out)).graph.node}
    assert ("com.microsoft", "SkipLayerNormalization") in ops


@pytest.mark.long
def test_compare_with_no_arguments_prints_the_table():
    """The README's main job, exactly as typed (its time is recorded in
    docs/PERFORMANCE.md, not asserted here)."""
    proc = subprocess.run([sys.executable, "-m", "blockc.cli", "compare"], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for needle in ("fusion's verdict", "gpt2-block (float32), batch=1, seq=128", "ort-cpu", "fused", "standard", "decomposed",
                   "vs standard", "max |err|", "fused against the rest"):
        assert needle in proc.stdout


def test_run_on_the_gpu_or_say_why_not(capsys):
    """--backend cuda runs the generated CUDA on a GPU where there is one, and
    otherwise says so plainly, pointing at the emulated backend."""
    from blockc.runtime.cuda_runner import cuda_available
    code, out, err = run(capsys, "run", "tiny", "--set", "layers=1", "--backend", "cuda", "--check")
    if cuda_available()[0]:
        assert code == 0, err
        worst = max(float(line.split()[-1]) for line in out.splitlines()[2:] if line.strip())
        assert worst < 1e-3
    else:
        assert code == 2 and "needs a GPU" in err and "cuda-emu" in err and "Traceback" not in err


# ---- blockc run on your data: --inputs FILE.npz, --save FILE.npz -------------------------------
TINY = ["tiny", "--set", "layers=1"]


def saved_sample(path, seed=3):
    """The inputs `blockc run tiny --seed SEED --dim seq=6` would sample, saved to ``path``."""
    import blockc
    model = blockc.build_model("tiny", {"layers": "1"})
    rng = np.random.default_rng(seed)
    np.savez(path, **{s.name: s.sample({"batch": 2, "seq": 6}, rng) for s in model.inputs()})


def run_backends():
    """Every backend of `blockc run`, skipped where it cannot run here."""
    from blockc.runtime.backend import backend_names, make_backend
    for name in backend_names():
        ok, why = make_backend(name).availability()
        if name == "torch-compile":  # half a minute of compiling, for the feeds path torch-eager takes
            ok, why = False, "slow; torch-eager covers the torch backends"
        yield pytest.param(name, marks=[] if ok else [pytest.mark.skip(reason=why)])


def test_run_times_the_weights_the_build_and_the_run_apart(capsys, tmp_path, monkeypatch):
    """A slow build (here 0.4 s of it, and the seeded weights, made on
    access) is never counted as the run's time."""
    import time as clock

    from blockc.runtime.backends.reference import ReferenceBackend, ReferenceCompiled
    real_compile, real_runner = ReferenceBackend.compile, ReferenceCompiled.unchecked_runner
    monkeypatch.setattr(ReferenceBackend, "compile",   # hints: taken, as a wrapper must (the reference has none)
                        lambda *a, hints=None, **k: clock.sleep(0.4) or real_compile(*a, **k))
    made = []
    monkeypatch.setattr(ReferenceCompiled, "unchecked_runner", lambda self, feeds, bindings: made.append(
        all(type(w) is np.ndarray for w in self.weights.values())) or real_runner(self, feeds, bindings))
    code, out, err = run(capsys, "run", *TINY, "--backend", "reference")
    assert code == 0, err
    times = re.search(r": weights made ([\d.]+) ms, build ([\d.]+) ms, first run ([\d.]+) ms$", out.splitlines()[0])
    assert times, out
    assert float(times[2]) >= 400 > float(times[3]) and made == [True]   # weights made before the build
    weights = tmp_path / "w.npz"
    from blockc.frontends import build_model, init_weights, save_weights
    save_weights(weights, init_weights(build_model("tiny", {"layers": "1"})))
    code, out, err = run(capsys, "run", *TINY, "--backend", "reference", "--weights", str(weights))
    assert code == 0, err
    assert re.search(r": build [\d.]+ ms, first run [\d.]+ ms$", out.splitlines()[0]), out   # read, not made


@pytest.mark.parametrize("backend", run_backends())
def test_run_on_saved_inputs_matches_the_seeded_run(backend, tmp_path, capsys):
    inputs, ref, out = tmp_path / "in.npz", tmp_path / "ref.npz", tmp_path / "out.npz"
    saved_sample(inputs)
    code, text, err = run(capsys, "run", *TINY, "--backend", "reference", "--seed", "3", "--dim", "seq=6",
                          "--save", str(ref))
    assert code == 0, err
    code, text, err = run(capsys, "run", *TINY, "--backend", backend, "--seed", "3", "--inputs", str(inputs),
                          "--save", str(out))
    assert code == 0, err
    assert f"batch=2, seq=6, inputs {inputs}:" in text.splitlines()[0]  # the dims come from the file
    assert text.rstrip().endswith(f"wrote {out}")
    with np.load(ref, allow_pickle=False) as want, np.load(out, allow_pickle=False) as got:
        assert sorted(got.files) == sorted(want.files) == ["logits", "probs"]
        for name in want.files:
            assert got[name].shape == want[name].shape == (2, 6, 256)
            tolerance = 0.0 if backend == "reference" else 1e-4 if "cuda" in backend else 1e-5
            assert np.max(np.abs(got[name] - want[name])) <= tolerance, name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.npz", "out.npz", "ref.npz"]  # no temp files


def test_run_inputs_agree_with_dim_or_say_so(tmp_path, capsys):
    inputs = tmp_path / "in.npz"
    saved_sample(inputs)
    assert run(capsys, "run", *TINY, "--backend", "reference", "--inputs", str(inputs), "--dim", "seq=6")[0] == 0
    code, _, err = run(capsys, "run", *TINY, "--backend", "reference", "--inputs", str(inputs), "--dim", "seq=8")
    assert code == 2 and "dimension 'seq' is 6 in the arrays of" in err and "but 8 was asked for" in err


def test_run_inputs_lists_every_mismatch(tmp_path, capsys):
    path = tmp_path / "bad.npz"
    np.savez(path, input_ids=np.array([[1, 2, 999]], dtype=np.int32), mask=np.ones((1, 3)))
    code, out, err = run(capsys, "run", *TINY, "--backend", "reference", "--inputs", str(path),
                         "--save", str(tmp_path / "out.npz"))
    assert code == 2 and out == "" and "Traceback" not in err
    lines = err.strip().splitlines()
    assert lines[0] == f"blockc: error: the arrays of {path} do not fit tiny's inputs (3 problems):"
    assert lines[1:] == ["  unexpected array 'mask' (the graph takes input_ids: i64[batch,seq])",
                         "  input 'input_ids': dtype int32, expected int64",
                         "  input 'input_ids': 1 of 3 ids out of range [0, 256) (min 1, max 999; it indexes "
                         "'tok.weight', which has 256 rows)"]
    assert not (tmp_path / "out.npz").exists()
    np.savez(path, input_ids=np.zeros((1, 129), np.int64))  # past the model's 128 positions
    code, _, err = run(capsys, "run", *TINY, "--backend", "reference", "--inputs", str(path))
    assert code == 2 and "dimension 'seq' is 129, over the model's maximum of 128" in err


def test_run_inputs_refuses_pickles(tmp_path, capsys):
    path = tmp_path / "p.npz"
    np.savez(path, input_ids=np.array([{"a": 1}], dtype=object))
    code, _, err = run(capsys, "run", *TINY, "--backend", "reference", "--inputs", str(path))
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "'input_ids' holds Python objects (pickled), which blockc does not load" in err


@pytest.mark.parametrize("flags, message", [
    (["--inputs", "{d}/none.npz"], "cannot read {d}/none.npz: no such file"),
    (["--inputs", "{d}"], "cannot read {d}: it is a folder"),
    (["--inputs", "{d}/in.npy"], "it is a single .npy array"),
    (["--inputs", "{d}/text.npz"], "not an .npz file"),
    (["--save", "{d}/no/such/folder/out.npz"], "the folder {d}/no/such/folder does not exist"),
    (["--save", "{d}"], "cannot write {d}: it is a folder"),
])
def test_run_bad_paths_are_one_line_errors(flags, message, tmp_path, capsys):
    np.save(tmp_path / "in.npy", np.zeros((1, 4), np.int64))
    (tmp_path / "text.npz").write_text("input_ids = 1, 2, 3\n")
    flags = [f.format(d=tmp_path) for f in flags]
    code, out, err = run(capsys, "run", *TINY, "--backend", "reference", *flags)
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.startswith("blockc: error: ") and len(err.strip().splitlines()) == 1
    assert message.format(d=tmp_path) in err


def test_generate_prints_each_prompts_ids_and_the_timings(capsys, tmp_path):
    import json
    from blockc import build_model, init_weights
    from blockc.generate import generate
    out_json = tmp_path / "gen.json"
    code, out, err = run(capsys, "generate", "llama-tiny", "--set", "layers=1", "--prompt-ids", "1,2,3",
                         "--prompt-ids", "4,5", "--max-new", "5", "--seed", "2", "--json", str(out_json))
    assert code == 0, err
    model = build_model("llama-tiny", {"layers": "1"})
    expected = generate(model, init_weights(model, seed=2), [[1, 2, 3], [4, 5]], 5).tokens
    lines = out.splitlines()
    assert lines[:2] == [f"[{k}] " + " ".join(map(str, ids)) for k, ids in enumerate(expected)]  # printed once
    assert re.match(r"whole run [\d.]+ s: start [\d.]+ s \(load [\d.]+ s, compile [\d.]+ s\), then [\d.]+ s "
                    r"generating", lines[2])
    assert re.match(r"time to first token [\d.]+ ms", lines[3])
    assert re.match(r"decode step [\d.]+ ms median, [\d.]+ ms p90 over 4 steps", lines[4])
    assert re.match(r"10 tokens at [\d.]+ tokens/s", lines[5])
    report = json.loads(out_json.read_text())
    assert report["tokens"] == expected and len(report["step_s"]) == 4 and report["first_token_s"] > 0
    assert report["whole_s"] > report["start_s"] >= report["compile_s"] > 0


def test_generate_runs_the_fused_graphs_unless_form_says_otherwise(capsys, monkeypatch):
    import blockc.generate.loop as loop
    asked, real = [], loop.form_of

    def counted(source, make, form, **kw):
        asked.append(form)
        return real(source, make, form, **kw)
    monkeypatch.setattr(loop, "form_of", counted)
    args = ["generate", "tiny", "--set", "layers=1", "--prompt-ids", "1,2,3", "--max-new", "2"]
    for extra, form in (([], "fused"), (["--form", "standard"], "standard"), (["--form", "decomposed"], "decomposed")):
        asked.clear()
        code, out, err = run(capsys, *args, *extra)
        assert code == 0, err
        assert asked == [form, form] and out.rstrip().endswith(f"on ort-cpu, {form} graphs)")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_generate_in_every_dtype_run_takes(dtype, capsys):
    # the command as a user types it; tests/generate/test_loop.py holds every backend
    args = ["tiny", "--set", "layers=1", "--set", f"dtype={dtype}", "--backend", "reference"]
    assert run(capsys, "run", *args)[0] == 0
    code, out, err = run(capsys, "generate", *args, "--prompt-ids", "1,2,3", "--max-new", "3")
    assert code == 0, err
    assert re.fullmatch(r"\[0\]( \d+){3}", out.splitlines()[0])


def test_generate_samples_with_a_seed(capsys):
    """--temperature/--top-k/--top-p/--repetition-penalty/--seed: the same
    seed gives the same ids, run after run and backend after backend (the
    draw happens on the host from the logits); another seed differs."""
    args = ["generate", "tiny", "--prompt-ids", "1,2,3", "--prompt-ids", "4,5", "--max-new", "12",
            "--temperature", "1.5", "--top-k", "50", "--top-p", "0.95", "--repetition-penalty", "1.2"]
    runs = []
    for extra in (["--seed", "7"], ["--seed", "7"], ["--seed", "7", "--backend", "reference"], ["--seed", "8"]):
        code, out, err = run(capsys, *args, *extra)
        assert code == 0, err
        runs.append(out.splitlines()[:2])
    assert runs[0] == runs[1] == runs[2] != runs[3]


def test_generate_gives_the_same_ids_whatever_the_cache(capsys):
    """--cache concat and --cache-len change where the keys and values are
    kept, never the ids: greedy ids agree with the default in-place cache
    sized just enough. llama-tiny (rotary, grouped-query attention): its
    random weights give varied ids, where tiny's repeat one."""
    args = ["generate", "llama-tiny", "--prompt-ids", "1,2,3", "--prompt-ids", "4,5", "--max-new", "6", "--seed", "3"]
    runs = []
    for extra in ([], ["--cache", "concat"], ["--cache-len", "100"], ["--cache", "inplace", "--cache-len", "8"]):
        code, out, err = run(capsys, *args, *extra)
        assert code == 0, err
        runs.append(out.splitlines()[:2])
    assert all(len(set(line.split()[1:])) > 2 for line in runs[0])
    assert runs[0] == runs[1] == runs[2] == runs[3]


@pytest.mark.parametrize("argv, message", [
    (["tiny", "--prompt-ids", "1,x"], "malformed --prompt-ids '1,x': expected integers separated by commas"),
    (["tiny", "--prompt-ids", "1,256"], "prompt 0: token id 256 is outside the vocabulary [0, 256)"),
    (["tiny", "--prompt-ids", "1", "--max-new", "0"], "max_new must be a positive integer, got 0"),
    (["tiny", "--prompt-ids", "1,2", "--max-new", "127"], "a prompt of 2 tokens and 127 new ones make 129 positions"),
    (["tiny", "--prompt-ids", "1", "--stop-id", "999"], "stop id 999 is outside the vocabulary [0, 256)"),
    (["gpt2-block", "--prompt-ids", "1"], "generate needs a decoder language model"),
    (["tiny", "--prompt-ids", "1", "--temperature", "-0.5"], "temperature must be >= 0"),
    (["tiny", "--prompt-ids", "1", "--temperature", "1", "--top-p", "1.5"], "top_p must be in (0, 1]"),
    (["tiny", "--prompt-ids", "1", "--temperature", "1", "--top-p", "0"], "top_p must be in (0, 1]"),
    (["tiny", "--prompt-ids", "1", "--top-k", "5"], "give --temperature T (> 0) with them"),
    (["tiny", "--prompt-ids", "1", "--temperature", "1", "--repetition-penalty", "0"], "repetition_penalty must be > 0"),
    (["tiny", "--prompt-ids", "1,2", "--max-new", "5", "--cache-len", "5"],
     "a prompt of 2 tokens and 5 new ones need a cache of 6 positions, over the preallocated cache_len=5"),
    (["tiny", "--prompt-ids", "1", "--cache-len", "0"], "cache_len must be a positive integer, got 0"),
    (["tiny", "--prompt-ids", "1", "--cache-len", "129"], "cache_len=129 is over the model's maximum of 128"),
    (["tiny", "--prompt-ids", "1", "--cache", "concat", "--cache-len", "8"],
     "cache_len sizes the in-place cache; the concat cache has no buffer to size"),
])
def test_generate_refuses_bad_input_in_one_line(capsys, argv, message):
    code, out, err = run(capsys, "generate", *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def hf_padding_attention_file(path):
    """One attention layer as Hugging Face's BERT exports it: the padding mask
    an additive bias holding float32's lowest on the masked keys."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    consts = {**{f"w{p}": rng.standard_normal((8, 8)) / 3 for p in "qkv"}, "heads": np.array([0, 0, 2, 4]),
              "joined": np.array([0, 0, 8]), "root": np.array(2.0), "one": np.array(1.0),
              "lowest": np.array(np.finfo(np.float32).min), "axes": np.array([1, 2])}
    init = [numpy_helper.from_array(a.astype(np.int64 if a.dtype.kind == "i" else np.float32), n)
            for n, a in consts.items()]
    nodes = []
    for p, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [helper.make_node("MatMul", ["x", f"w{p}"], [f"{p}2"]),
                  helper.make_node("Reshape", [f"{p}2", "heads"], [f"{p}3"]),
                  helper.make_node("Transpose", [f"{p}3"], [p], perm=perm)]
    steps = [("Cast", ["attention_mask"], "m", {"to": TensorProto.FLOAT}), ("Sub", ["one", "m"], "pads", {}),
             ("Mul", ["pads", "lowest"], "bias2", {}), ("Unsqueeze", ["bias2", "axes"], "bias", {}),
             ("MatMul", ["q", "k"], "qk", {}), ("Div", ["qk", "root"], "scaled", {}),
             ("Add", ["scaled", "bias"], "scores", {}), ("Softmax", ["scores"], "probs", {"axis": -1}),
             ("MatMul", ["probs", "v"], "o", {}), ("Transpose", ["o"], "o2", {"perm": [0, 2, 1, 3]}),
             ("Reshape", ["o2", "joined"], "out", {})]
    nodes += [helper.make_node(op, ins, [out], **attrs) for op, ins, out, attrs in steps]
    graph = helper.make_graph(nodes, "hf_padding", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "seq", 8])], init)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return str(path)


def test_check_and_run_check_catch_a_fused_op_that_zeroes_fully_masked_rows(tmp_path, capsys, monkeypatch):
    """Without clamping the mask, ONNX Runtime's opset-23 Attention reads
    float32's lowest as -inf and gives zeros on a fully masked row, where the
    file averages the values: the masks ``check`` and ``run --check`` sample
    hold such rows, so both show it."""
    from blockc.ops import fused_onnx
    args = [hf_padding_attention_file(tmp_path / "hf.onnx"), "--backend", "ort", "--fused-as", "onnx23"]

    def run_check() -> tuple[int, float, str]:
        code, out, err = run(capsys, "run", *args, "--form", "fused", "--check")
        return code, float(out.splitlines()[-1].split()[-1]), err

    code, out, _ = run(capsys, "check", *args)
    assert code == 0 and "FAIL" not in out
    code, error, _ = run_check()
    assert code == 0 and error < 1e-5
    monkeypatch.setattr(fused_onnx, "clamp_bias", lambda e, bias, big: bias)
    # the patched encoding is new code that the compile cache's key (blockc's source digest) cannot see
    monkeypatch.setenv("BLOCKC_CACHE", str(tmp_path / "cache-after-the-patch"))
    code, out, _ = run(capsys, "check", *args)
    assert code == 1 and re.search(r"fuse_attention .* FAIL", out)
    code, error, err = run_check()   # once exit status 0 all the same
    assert code == 1 and error > 0.1 and err.startswith("blockc: check failed: ONNX Runtime (cpu, fused ops as "
                                                        "onnx23) is further from the float64 reference than")


def test_key_value_flags_are_read_by_one_parser():
    """--set and --dim split KEY=VALUE the same way (frontends/settings.parse_pairs):
    a missing key is refused by both, where --dim once took '=128' as a dim named ''."""
    from blockc.cli.common import parse_dims
    from blockc.errors import BlockcError
    from blockc.frontends.catalog import parse_sets
    for parse, item in ((parse_sets, "=2"), (parse_dims, "=128")):
        with pytest.raises(BlockcError, match="malformed"):
            parse([item])
    assert parse_sets([" layers = 2 "]) == {"layers": "2"} and parse_dims(["seq=-1"]) == {"seq": -1}
