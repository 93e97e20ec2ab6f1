"""``--tp N`` on the commands (``blockc/cli/tensor_parallel.py``): the model
split over N ranks agrees with the unsplit model, per-rank views and files,
and the refusals. The ranks are processes on this machine talking through
gloo on 127.0.0.1; each launch is bounded by its timeout."""
import json
import time

import numpy as np
import onnx
import pytest

from blockc.cli import main

# narrow (GPT-2 is 768 wide): the split is the point, and 4 heads still split over 2 ranks
SMALL = ["--set", "layers=2", "--set", "vocab=64", "--set", "d_model=64", "--set", "heads=4"]
# GPT-3 175B (Brown et al. 2020, table 2.1): 96 layers of d=12288, 96 heads, 2048 positions.
GPT3 = ["gpt2", "--set", "d_model=12288", "--set", "heads=96", "--set", "layers=96", "--set", "max_positions=2048"]


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_run_tp2_gives_the_unsplit_outputs(tmp_path, capsys):
    one, two = str(tmp_path / "tp1.npz"), str(tmp_path / "tp2.npz")
    code, out, err = run(capsys, "run", "gpt2", *SMALL, "--tp", "1", "--backend", "torch-eager", "--save", one)
    assert code == 0, err
    code, out, err = run(capsys, "run", "gpt2", *SMALL, "--tp", "2", "--check", "--save", two)   # torch-eager
    assert code == 0, err
    assert "on 2 ranks of torch-eager" in out and "max |err| vs f64" in out
    a, b = np.load(one), np.load(two)
    assert set(a.files) == set(b.files) == {"logits", "probs"}
    for name in a.files:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-5, atol=1e-5)


SAMPLED = ["--temperature", "0.9", "--top-k", "50", "--top-p", "0.9", "--repetition-penalty", "1.2", "--seed", "7"]


@pytest.mark.parametrize("sampling", [[], SAMPLED], ids=["greedy", "sampled"])
def test_generate_tp2_prints_the_text_of_one_process(hf_dir, tmp_path, capsys, sampling):
    """Text in and out, the directory's generation config, sampling and a
    stop id: the same command on 2 ranks prints and writes what one process
    does (rank 0 samples and stops rows for both)."""
    path = hf_dir("llama")
    argv = ["generate", str(path), "--prompt", "The quick brown fox", "--prompt", "Café", "--max-new", "10",
            *sampling]

    def generated(*extra):
        code, out, err = run(capsys, *argv, *extra, "--json", str(tmp_path / "g.json"))
        assert code == 0, err
        return out.split("whole run")[0], json.loads((tmp_path / "g.json").read_text())

    _, free = generated("--backend", "torch-eager")
    stop = ["--stop-id", str(free["tokens"][0][3])]   # row 0 stops after its 4th token, or before
    text, single = generated("--backend", "torch-eager", *stop)
    split_text, split = generated("--tp", "2", *stop)
    assert split_text == text and split["text"] == single["text"] and split["tokens"] == single["tokens"]
    assert len(split["tokens"][0]) <= 4 < len(split["tokens"][1]) and split["tp"] == 2


def test_generate_llama_tiny_tp2_gives_the_tokens_of_tp1(tmp_path, capsys):
    """The issue's words: ``blockc generate llama-tiny --tp 2`` gives the tokens of ``--tp 1``."""
    tokens = []
    for tp in ("1", "2"):
        path = tmp_path / f"tp{tp}.json"
        code, out, err = run(capsys, "generate", "llama-tiny", "--prompt-ids", "5,17,42,9", "--prompt-ids", "100,3",
                             "--max-new", "6", "--tp", tp, "--json", str(path))
        assert code == 0, err
        report = json.loads(path.read_text())
        assert report["tp"] == int(tp)
        tokens.append(report["tokens"])
    assert tokens[0] == tokens[1] and [len(t) for t in tokens[0]] == [6, 6]


@pytest.mark.parametrize("command", ["show", "fusions"])
def test_show_and_fusions_print_each_rank(command, capsys, tmp_path):
    extra = ["--no-onnx-forms", "--json", str(tmp_path / "f.json")] if command == "fusions" else []
    code, out, err = run(capsys, command, "gpt2", *SMALL, "--tp", "2", *extra)
    assert code == 0, err
    assert [line for line in out.splitlines() if line.startswith("# rank")] == ["# rank 0 of 2", "# rank 1 of 2"]
    if command == "show":   # each rank's graph holds its collectives
        assert out.count("all_reduce") >= 2 * 2 * 2
    else:   # docs/fusion-report.md: one object, each rank's report in it
        report = json.loads((tmp_path / "f.json").read_text())
        assert {k: report[k] for k in ("schema", "model", "tp", "pad_vocab")} == {
            "schema": "blockc.fusion-report-ranks/1", "model": "gpt2", "tp": 2, "pad_vocab": False}
        assert [r["rank"] for r in report["ranks"]] == [0, 1]
        for rank in report["ranks"]:
            assert rank["schema"] == "blockc.fusion-report/1" and rank["counts"]["add_layernorm"]["fused"] > 0


def test_summary_tp8_of_gpt3_is_an_eighth_per_rank(capsys):
    """Parameters 1/8 of 175B per rank; peak activations split too. A
    vocabulary of 8192 (0.3% of the parameters) keeps the peak inside the
    blocks: with GPT-2's 50257 it is the logits and probabilities, which
    every rank holds whole once gathered. The unsplit model's peak is the
    feed-forward's: 9 [b, s, d] values, the input and the 4d-wide hidden
    before and after GELU. A rank holds an eighth of that hidden (one [b, s,
    d] value in all), so its peak moves to an all-reduce: the residual, the
    partial sum and the reduced sum, 3 values every rank holds whole."""
    t0 = time.monotonic()
    code, out, err = run(capsys, "summary", *GPT3, "--set", "vocab=8192", "--tp", "8")
    assert code == 0, err
    assert time.monotonic() - t0 < 60
    d_bytes = 128 * 12288 * 4   # one [b=1, s=128, d] float32 value
    assert f"unsplit, {9 * d_bytes:,} activation bytes at peak" in out
    rows = [line for line in out.splitlines() if line.startswith("rank ")]
    assert len(rows) == 8
    for row in rows:
        params = int(row.split(":")[1].split()[0].replace(",", "")) / 4   # float32
        assert abs(params - 175e9 / 8) / (175e9 / 8) < 0.01, row
        assert f", {3 * d_bytes:,} activation bytes at peak" in row and "all_reduce" in row


def test_export_tp2_writes_a_checker_clean_file_per_rank(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    code, out, err = run(capsys, "export", "gpt2", *SMALL, "--tp", "2", "-o", str(path))
    assert code == 0, err
    for r in range(2):
        model = onnx.load(str(tmp_path / f"m.rank{r}.onnx"))
        onnx.checker.check_model(model, full_check=True)
        assert any(n.op_type == "AllReduce" for n in model.graph.node)
    assert not path.exists() and "AllReduce" in out


def test_export_tp8_of_gpt3_without_weights(tmp_path, capsys):
    """In seconds, each rank's file declaring an eighth of 175B parameters
    (its initializers' shapes, their data left out), as the command says."""
    t0 = time.monotonic()
    code, out, err = run(capsys, "export", *GPT3, "--tp", "8", "--pad-vocab", "--no-weights",
                         "-o", str(tmp_path / "g.onnx"))
    assert code == 0, err
    assert time.monotonic() - t0 < 60
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"g.rank{r}.onnx" for r in range(8)]
    said = [line for line in out.splitlines() if line.startswith("wrote ")]
    for r, line in enumerate(said):
        model = onnx.load(str(tmp_path / f"g.rank{r}.onnx"), load_external_data=False)
        params = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
        assert abs(params - 175e9 / 8) / (175e9 / 8) < 0.01, (r, params)
        assert f"g.rank{r}.onnx: rank {r} of 8, " in line and line.endswith(" parameter bytes")
        said_params = int(line.split(", ")[-1].split()[0].replace(",", "")) / 4   # float32
        assert abs(said_params - params) < 100, line   # the file's few constants (shapes) beside them
    assert len(said) == 8


def test_compare_tp2_by_compares_method(tmp_path, capsys):
    """Each contestant on 2 ranks and on 1, in blocks of fresh sessions with
    an A/A control, ratios with intervals over the blocks, the collectives'
    share, the bytes the communication model says a rank all-reduces, and
    the split outputs checked against one rank's."""
    path = tmp_path / "c.json"
    code, out, err = run(capsys, "compare", "gpt2", "--set", "layers=1", "--set", "vocab=256", "--tp", "2",
                         "--seq", "16", "--blocks", "2", "--warmup", "0", "--repeats", "2", "--json", str(path))
    assert code == 0, err
    report = json.loads(path.read_text())
    assert report["schema"] == "blockc.compare-tp/2" and report["tp"] == 2
    assert report["timing"]["blocks"] == 2 and report["timing"]["repeats"] == 2
    assert report["all_reduce_bytes_per_rank"] == (2 * 1 + 1) * 16 * 768 * 4   # 2·b·s·d a block, and the embedding
    rows = {(r["backend"], r["form"], r["tp"]): r for r in report["results"]}
    assert set(rows) == {("torch-eager", form, tp) for form in ("standard", "fused") for tp in (1, 2)}
    for (_, _, tp), r in rows.items():
        assert r["step_ms"] > 0 and (r["collectives"] == 0 if tp == 1 else r["collectives"] == 4)
        assert r["share"] == r["collectives_ms"] / r["step_ms"] and (r["share"] == 0) == (tp == 1)
    pairs = {(q["a"], q["b"]) for q in report["ratios"]}
    assert ("torch-eager/fused/tp2", "torch-eager/fused/tp1") in pairs
    assert ("torch-eager/fused/tp2", "torch-eager/standard/tp2") in pairs
    for q in report["ratios"]:
        assert q["blocks"] == 2 and q["low"] <= q["speedup"] <= q["high"] and q["paired"]
    assert [(v["form"], v["aa"]["blocks"]) for v in report["verdicts"]] == [("standard", 2), ("fused", 2)]
    assert report["outputs_ok"] and [o["form"] for o in report["outputs"]] == ["standard", "fused"]
    assert all(o["ok"] and o["max_abs_error"] <= 1e-5 for o in report["outputs"])
    assert "A/A" in out and "too few blocks to tell" in out and "max |diff|" in out


def test_compare_tp_fails_where_the_split_outputs_differ(monkeypatch, capsys):
    """The report is printed, then the command fails as ``run --check`` does."""
    from blockc.compare import tensor_parallel
    split = {"logits": np.zeros((1, 2, 4), np.float32)}
    one = {"logits": np.full((1, 2, 4), 3e-5, np.float32)}
    check = tensor_parallel._output_check("torch-eager", "fused", [{"split": split, "one": one}, {"split": one}])
    assert not check["ok"] and abs(check["max_abs_error"] - 3e-5) < 1e-9
    close = {"logits": np.full((1, 2, 4), 5e-6, np.float32)}
    assert tensor_parallel._output_check("torch-eager", "fused", [{"split": close, "one": split}])["ok"]

    def failing(model, tp, **_):
        o = {"backend": "torch-eager", "form": "fused", "max_abs_error": 3e-5, "tolerance": 1e-5, "ok": False}
        return {"model": model, "tp": tp, "shape": {"batch": 1, "seq": 16}, "all_reduce_bytes_per_rank": 0,
                "timing": {"blocks": 1, "rounds": 1, "repeats": 1}, "results": [], "verdicts": [],
                "outputs": [o], "outputs_ok": False}
    monkeypatch.setattr(tensor_parallel, "compare_tp", failing)
    code, out, err = run(capsys, "compare", "gpt2", "--tp", "2")
    assert code == 1 and "FAILED" in out
    assert err == ("blockc: check failed: torch-eager fused on 2 ranks differs from one rank by up to 3e-05 "
                   "(more than 1e-05)\n")


def test_a_master_port_in_use_is_refused_before_any_rank_starts(monkeypatch, capsys):
    """``$MASTER_PORT``, as torchrun reads it, is where blockc's launcher meets its ranks too."""
    import socket

    from blockc.parallel import launch
    started = []
    monkeypatch.setattr(launch, "_start", lambda *a: started.append(a))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        monkeypatch.setenv("MASTER_PORT", str(port))
        code, _, err = run(capsys, "run", "llama-tiny", "--set", "layers=1", "--tp", "2")
    one_line_error(code, err, f"port {port} on 127.0.0.1 is already in use: pick a free MASTER_PORT")
    monkeypatch.setenv("MASTER_PORT", "twenty")
    code, _, err = run(capsys, "run", "llama-tiny", "--set", "layers=1", "--tp", "2")
    one_line_error(code, err, "MASTER_PORT='twenty' is not a port number (1 to 65535)")
    assert not started


def one_line_error(code, err, needle):
    assert code == 2 and err.startswith("blockc: error: ") and len(err.strip().splitlines()) == 1, err
    assert needle in err, err


@pytest.mark.parametrize("argv, needle", [
    (["show", "gpt2", "--tp", "0"], "--tp must be a positive number of ranks, got 0"),
    (["summary", "gpt2", "--tp", "-2"], "--tp must be a positive number of ranks, got -2"),
    (["show", "llama-tiny", "--tp", "8"], "do not split across 8 ranks (more ranks than heads)"),
    (["run", "llama-tiny", "--tp", "8"], "do not split across 8 ranks (more ranks than heads)"),
    (["run", "gpt2", "--set", "layers=1", "--tp", "0"], "--tp must be a positive number of ranks, got 0"),
    (["run", "bert-base", "--set", "layers=1", "--set", "vocab=256", "--tp", "8"],
     "12 heads do not divide among 8 ranks (--tp must divide the heads and the K/V heads)"),
    (["generate", "llama-tiny", "--prompt-ids", "1", "--tp", "3"], "does not divide by 3 ranks (pad it to a multiple of 3: --pad-vocab)"),
    (["run", "gpt2", "--set", "layers=1", "--tp", "2", "--backend", "ort"],
     "a tensor-parallel rank runs on PyTorch: give --backend torch-eager or torch-compile, not 'ort'"),
    (["run", "gpt2", "--tp", "2", "--fused-as", "contrib"], "backend 'torch-eager' does not take the option "
                                                            "'fused_as' (ort, ort-cpu, ort-cuda take it)"),
    (["run", "gpt2", "--tp", "2", "--form", "fused", "--disable", "fuse_attention"],
     "--tp runs every pass on each rank's graph: --disable and --print-after are not taken with --tp"),
    (["run", "gpt2", "--tp", "2", "--backend", "reference"], "not 'reference'"),
    (["compare", "gpt2", "--tp", "2", "--min-time", "3"], "--min-time is not taken with --tp"),
    (["compare", "gpt2", "--tp", "1"], "compare --tp N times N ranks against one: give --tp 2 or more (not 1)"),
    (["compare", "gpt2", "--tp", "2", "--fused-as", "contrib"], "--fused-as is not taken with --tp"),
    (["compare", "gpt2", "--tp", "2", "--backends", "ort-cpu"],
     "a tensor-parallel rank runs on PyTorch: give --backends torch-eager or torch-compile, not 'ort-cpu'"),
    (["compare", "gpt2", "--tp", "2", "--batch", "1,8"], "compare --tp measures one shape: give one --batch and one"),
    (["show", "gpt2", "--pad-vocab"], "--pad-vocab pads the vocabulary to split it over --tp ranks: give --tp N"),
    (["generate", "llama-tiny", "--prompt-ids", "1", "--tp", "2", "--backend", "ort-cpu"],
     "a tensor-parallel rank runs on PyTorch: give --backend torch-eager or torch-compile, not 'ort-cpu'"),
    (["generate", "llama-tiny", "--prompt-ids", "1", "--tp", "2", "--cache-pairs", "a=b"],
     "--cache-pairs (an ONNX decoder file's cache names) is not taken with --tp"),
])
def test_refusals_are_one_line(argv, needle, capsys):
    code, _, err = run(capsys, *argv)
    one_line_error(code, err, needle)
