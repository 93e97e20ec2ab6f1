"""The excerpts of blockc's output in the README and the docs/ pages are
checked against blockc, so a change to the printer, the value numbering, the
models or the error messages cannot leave them stale; every ``blockc ...``
command in their code blocks is parsed by the CLI, and the ones whose output
is shown are run.

An excerpt is compared line by line; a line ``...`` stands for any number of
lines of the real output (see ``check_excerpt``). To refresh one, run the
command the test names and paste its output, eliding with ``...``.
"""
import re
import shlex
import sys
import textwrap
from pathlib import Path

import pytest

from blockc.cli import build_parser, main

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# The README first: the pages are read in this order (the first generate command is the README's).
PAGES = [README] + sorted((ROOT / "docs").glob("*.md"))
GAP = "..."


def fenced_blocks(markdown: str) -> list[list[str]]:
    """The lines inside each ``` fence of a Markdown text."""
    blocks, current = [], None
    for line in markdown.splitlines():
        if line.startswith("```"):
            if current is None:
                current = []
            else:
                blocks.append(current)
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def page_blocks() -> list[list[str]]:
    """Every ``` block of the README and the docs/ pages, in ``PAGES``' order."""
    return [b for page in PAGES for b in fenced_blocks(page.read_text())]


def readme_block(first_line_starts: str) -> list[str]:
    """The one code block of the README or a docs/ page whose first line starts with ``first_line_starts``."""
    found = [b for b in page_blocks() if b and b[0].startswith(first_line_starts)]
    assert len(found) == 1, f"the README and docs/ have {len(found)} ``` blocks starting {first_line_starts!r}, expected 1"
    return found[0]


def check_excerpt(excerpt: list[str], output: list[str]) -> None:
    """Assert that ``excerpt`` is ``output`` with runs of lines elided.

    A line that is ``...`` (any indent) stands for any number of output lines;
    every other line must equal an output line, in order, and lines not
    separated by ``...`` must be consecutive in the output. The excerpt's
    first and last lines must be the output's first and last, unless they are
    ``...``.
    """
    chunks, chunk = [], []
    for line in excerpt:
        if line.strip() == GAP:
            chunks.append(chunk)
            chunk = []
        else:
            chunk.append(line)
    chunks.append(chunk)
    where = 0
    for i, chunk in enumerate(chunks):
        if not chunk:
            continue
        anchored_start = i == 0
        anchored_end = i == len(chunks) - 1
        if anchored_end:
            starts = [len(output) - len(chunk)]
        elif anchored_start:
            starts = [0]
        else:
            starts = range(where, len(output) - len(chunk) + 1)
        at = next((s for s in starts if s >= where and output[s:s + len(chunk)] == chunk), None)
        assert at is not None and not (anchored_start and at != 0), (
            "the README excerpt is stale: these lines"
            + (" (the start of the output)" if anchored_start else "")
            + (" (the end of the output)" if anchored_end else "")
            + (f" are not in the output after its line {where}:\n" if where else " are not in the output:\n")
            + "\n".join(chunk) + "\n--- the output ---\n" + "\n".join(output))
        where = at + len(chunk)


def test_check_excerpt_catches_stale_excerpts():
    output = ["graph g() {", "  %0 = a", "  %1 = b", "  %2 = c", "  return y=%2", "}"]
    check_excerpt(["graph g() {", "  ...", "  %1 = b", "  ...", "  return y=%2", "}"], output)
    check_excerpt(output, output)
    check_excerpt(["graph g() {", "  %0 = a", "  ...", "}"], output)
    stale = [
        ["graph g() {", "  ...", "  return y=%1", "}"],            # renumbered
        ["graph g() {", "  ...", "  %2 = c", "  %1 = b", "  ...", "}"],   # out of order
        ["graph g() {", "  %0 = a", "  %2 = c", "  ...", "}"],     # a line left out without "..."
        ["  %0 = a", "  ...", "}"],                                 # the first line is not the output's
        ["graph g() {", "  ...", "  %2 = c"],                       # nor is the last
    ]
    for excerpt in stale:
        with pytest.raises(AssertionError, match="stale"):
            check_excerpt(excerpt, output)


def test_ir_excerpt_is_blockc_show_tiny(capsys):
    # docs/DSL.md "## The IR": the start and the end of `blockc show tiny`.
    excerpt = readme_block("graph tiny(")
    assert main(["show", "tiny"]) == 0
    check_excerpt(excerpt, capsys.readouterr().out.splitlines())


# The my_model.py that the README's error message comes from: line 14 is the bad matmul.
MY_MODEL = textwrap.dedent("""\
    from blockc.frontends import InputSpec, Model, Parameter, symbol
    from blockc.ir.dtypes import DType


    class Bad(Model):
        def __init__(self):
            super().__init__()
            self.w = Parameter((32, 8))

        def inputs(self):
            return [InputSpec("x", DType.float32, (symbol("batch"), 16))]

        def forward(self, x):
            return x @ self.w


    build = Bad
""")


def test_error_excerpt_is_what_blockc_prints(tmp_path, monkeypatch, capsys):
    (excerpt,) = readme_block("my_model.py:")
    (tmp_path / "my_model.py").write_text(MY_MODEL)
    monkeypatch.chdir(tmp_path)
    assert main(["show", "my_model.py:build"]) != 0
    err = capsys.readouterr().err
    assert any(line.endswith(excerpt) for line in err.splitlines()), f"README: {excerpt}\nblockc: {err}"


def test_gpt2_parameter_count_is_blockc_summary_gpt2(capsys):
    # The README's "blockc summary gpt2 ... 124,439,808 in all", and docs/DSL.md's count of GPT-2's parameters.
    text = "\n".join(page.read_text() for page in PAGES)
    counts = re.findall(r"(\d{1,3}(?:,\d{3})+) in all", text) + re.findall(r"GPT-2's (\d{1,3}(?:,\d{3})+)", text)
    assert len(counts) >= 2
    assert main(["summary", "gpt2"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    for count in counts:
        assert first.startswith(f"gpt2 (DecoderLM): {count} parameters"), f"README says {count}; blockc: {first}"


# A command with a placeholder for what the reader fills in (``--prompt-ids <128 ids>``) is not a
# command as typed: docs/PERFORMANCE.md records such runs.
PLACEHOLDER = re.compile(r"<[^>]+>")


def readme_command_lines() -> list[list[str]]:
    """Every ``blockc ...`` line of the code blocks of the README and the docs/
    pages, as words, without its comment."""
    lines = []
    for block in page_blocks():
        for line in block:
            if line.startswith("blockc ") and not PLACEHOLDER.search(line):
                lines.append(shlex.split(line, comments=True))
    return lines


def test_the_commands_of_the_docs_pages_are_read_too():
    # The docs/ pages' commands are parsed as the README's are: at least the CUDA and export ones moved there.
    commands = [" ".join(words) for words in readme_command_lines()]
    assert any(c.startswith("blockc export gpt2 --set layers=2000") for c in commands)
    assert any(c.startswith("blockc summary gpt2 --set d_model=12288") for c in commands)


@pytest.mark.parametrize("words", readme_command_lines(), ids=" ".join)
def test_readme_commands_parse(words):
    # The commands shown are accepted by the CLI: no renamed command or option.
    build_parser().parse_args(words[1:])


def test_compare_verdict_excerpt_is_the_80_column_table():
    """The README's verdict excerpt is what ``compare``'s verdict table prints
    at 80 columns for the figures it shows."""
    import io

    from rich.console import Console

    from blockc.compare.table import verdict_table

    def interval(x, low, high, verdict):
        return {"speedup": x, "low": low, "high": high, "blocks": 5, "verdict": verdict, "paired": True}
    report = {"shapes": [{"batch": 1, "seq": 128}], "timing": {"blocks": 5},
              "verdicts": [{"shape": {"batch": 1, "seq": 128}, "backend": "ort-cpu", "variant": "basic",
                            "fusion": interval(1.26, 1.20, 1.33, "faster"),
                            "aa": interval(0.97, 0.92, 1.03, "no difference resolved"), "resolved": True,
                            "max_abs_error": {"fused": 5.8e-08, "standard": 5.8e-08}}]}
    out = io.StringIO()
    Console(file=out, width=80, markup=False).print(verdict_table(report))
    check_excerpt(readme_block("fusion's verdict"), [line.rstrip() for line in out.getvalue().splitlines()])


# The README's placeholder for a Hugging Face directory, run on a random one (``hf_dirs.save_hf_dir``)
HF_DIR = "path/to/hf-dir"


def test_generate_excerpt_is_what_blockc_generates(tmp_path, capsys):
    # README "## Generate": the ids of its first example (the timings after them vary, so are
    # elided); the sampling example after it runs too, and each first line of a block that
    # generates text (the README's and docs/GENERATION.md's), on a random llama directory in
    # place of path/to/hf-dir.
    commands = [b[0] for b in page_blocks()
                if b and b[0].startswith("blockc generate") and not PLACEHOLDER.search(b[0])]
    first, *others = [c for c in commands if HF_DIR not in c]
    assert main(shlex.split(first)[1:]) == 0
    check_excerpt(readme_block("[0] "), capsys.readouterr().out.splitlines())
    assert others, "the README's sampling example"
    for command in others:
        assert main(shlex.split(command)[1:]) == 0, command
    texts = [c for c in commands if HF_DIR in c]
    assert texts, "the README's text examples"
    sys.path.insert(0, str(Path(__file__).resolve().parent / "frontends"))
    pytest.importorskip("transformers")
    from hf_dirs import save_hf_dir
    path = str(save_hf_dir("llama", tmp_path / "llama", seed=0))
    for command in texts:
        assert main([w.replace(HF_DIR, path) for w in shlex.split(command, comments=True)[1:]]) == 0, command


def test_onnx_excerpt_is_what_blockc_prints(tmp_path, monkeypatch, capsys):
    # README "### Importing ONNX": its commands run in order, the last one's output is the excerpt.
    block = readme_block("blockc export gpt2-block")
    monkeypatch.chdir(tmp_path)
    for line in block:
        capsys.readouterr()
        assert main(shlex.split(line)[1:]) == 0, line
    check_excerpt(readme_block("block.onnx (standard form)"), capsys.readouterr().out.splitlines())


def test_the_readme_torchrun_runs_the_job_its_python_writes(tmp_path, monkeypatch):
    """The README's Parallel section, as written: its Python writes a job,
    its ``torchrun`` line starts two ranks on it (``python -m
    torch.distributed.run``, on a free port), and the ranks write the
    outputs of the unsplit model."""
    import os
    import socket
    import subprocess

    import numpy as np
    torch = pytest.importorskip("torch")
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("this torch has no gloo process group")
    (line,) = readme_block("torchrun --nproc-per-node")
    python = "\n".join(next(b for b in fenced_blocks(README.read_text()) if any("write_job(" in ln for ln in b)))
    monkeypatch.chdir(tmp_path)
    exec(compile(python, "README.md", "exec"), {})   # writes job/job.json
    words = shlex.split(line.split("#")[0])
    assert words[0] == "torchrun" and "--tp" not in words
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--master-addr", "127.0.0.1",
                           "--master-port", str(port), *words[1:]], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    from blockc.frontends import build_model, init_weights, trace
    from blockc.runtime.torch_runner import run_torch
    model = build_model("llama-tiny", {})
    feeds = dict(np.load("job/feeds0.npz"))
    want = run_torch(trace(model), init_weights(model, seed=0), feeds)
    for rank in (0, 1):
        with np.load(f"job/case0.rank{rank}.npz") as got:
            np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-5, atol=1e-5)
