"""Generation from the user's seat: process start to last token, blockc against
ONNX Runtime GenAI and Hugging Face ``generate`` (issue 24).

Every run is a fresh process, timed by this script from before it starts to
after it exits (wall) with its peak resident memory (``wait4``'s
``ru_maxrss``); each process also reports its own split: the start (loading
and compiling, or GenAI's model load, or Hugging Face's ``from_pretrained``),
the first token and the time per token after it. Each start is counted
after the process's imports, as blockc's is (its ``start_s`` begins after
the CLI has imported blockc), so a start is the model's load alone; the
whole run counts the imports of all three. The contestants:

* ``blockc cold``: ``blockc generate DIR --prompt-ids ...`` with an empty
  ``BLOCKC_CACHE`` (tracing, optimizing, exporting, both sessions);
* ``blockc warm``: the same with the compile cache filled by an earlier run;
  ``blockc warm (A/A)`` is a second warm run in the same block, the control:
  its ratio to ``blockc warm`` shows what the machine's noise alone makes;
* ``genai``: ONNX Runtime GenAI's model builder (fp32, CPU) run once on the
  same Hugging Face directory, then ``og.Generator`` greedy in a Python named
  by ``BLOCKC_GENAI_PYTHON`` (skipped, saying so, where it is unset). The
  builder itself needs transformers 5: it runs in this Python with only the
  ``onnxruntime_genai`` package taken from that environment. GenAI's builder
  has no GPT-2: that model is run by blockc and Hugging Face only;
* ``hf``: Hugging Face ``generate`` (torch, greedy). torch's float32 GEMMs on
  a CPU can be 2-3x slower than ONNX Runtime's (MLAS), so its per-token
  figure says as much about that as about the framework.

The runs go in independent blocks (``--blocks``), the contestants shuffled in
each; a ratio is the geometric mean over blocks with a 95% bootstrap interval
(``runtime.timing.ratio_interval``), as ``bench/cpu_targets.py`` does. Greedy
tokens must be equal among all contestants (the script stops otherwise).

Models (random weights, ``tests/frontends/hf_dirs.save_hf_dir``): ``llama``,
125M (12 layers, d=768, 12 heads on 4 K/V heads, vocab 32000) and
``gpt2`` small (12 layers, d=768, vocab 50257). Prompts of 128 tokens, 64 and
512 new, batch 1 and 4.

    python bench/generate_e2e.py                # the full matrix
    python bench/generate_e2e.py --quick        # llama, 64 new, batch 1, 3 blocks
    python bench/generate_e2e.py --work DIR --json FILE

Prints markdown for docs/PERFORMANCE.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "frontends"))

from blockc.compare.machine import cpu_name  # noqa: E402
from blockc.runtime.timing import ratio_interval  # noqa: E402

MODELS = {
    "llama": ("llama", dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4,
                            intermediate_size=2048, max_position_embeddings=1024, vocab_size=32000)),
    "gpt2": ("gpt2", dict(n_embd=768, n_layer=12, n_head=12, n_positions=1024, vocab_size=50257)),
}
PROMPT_LEN = 128
GENAI_PYTHON = os.environ.get("BLOCKC_GENAI_PYTHON")

HF_CHILD = """
import json, sys, time
import torch, transformers
torch.set_num_threads(int(sys.argv[4]))
t0 = time.perf_counter()
model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1])
prompts, new = json.loads(sys.argv[2]), int(sys.argv[3])
start_s = time.perf_counter() - t0
stamps = []
class Stamp(transformers.StoppingCriteria):
    def __call__(self, input_ids, scores, **kw):
        stamps.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)
ids = torch.tensor(prompts)
t = time.perf_counter()
out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                     stopping_criteria=[Stamp()])
steps = [b - a for a, b in zip(stamps, stamps[1:])]
print(json.dumps({"tokens": out[:, ids.shape[1]:].tolist(), "start_s": start_s, "first_token_s": stamps[0] - t,
                  "step_s": steps}))
"""

GENAI_CHILD = """
import json, sys, time
import numpy as np
import onnxruntime_genai as og
t0 = time.perf_counter()
model = og.Model(sys.argv[1])
prompts, new = json.loads(sys.argv[2]), int(sys.argv[3])
start_s = time.perf_counter() - t0
params = og.GeneratorParams(model)
params.set_search_options(do_sample=False, max_length=len(prompts[0]) + new, batch_size=len(prompts))
t = time.perf_counter()
g = og.Generator(model, params)
g.append_tokens(np.array(prompts, dtype=np.int32))
stamps, tokens = [], [[] for _ in prompts]
while not g.is_done() and len(tokens[0]) < new:
    g.generate_next_token()
    for row, tok in enumerate(g.get_next_tokens()):
        tokens[row].append(int(tok))
    stamps.append(time.perf_counter())
steps = [b - a for a, b in zip(stamps, stamps[1:])]
print(json.dumps({"tokens": tokens, "start_s": start_s, "first_token_s": stamps[0] - t, "step_s": steps}))
"""


def in_child(code: str, *a, **k) -> None:
    """``code`` run in a Python of its own with ``a`` and ``k`` bound. A
    process this script starts inherits its size as the start of its peak
    RSS (``ru_maxrss`` counts the forked child before its exec), so what
    makes a model (torch, a whole model's weights) must not grow this one:
    a run once reported 1.15 GiB for every contestant after this script
    had made the GPT-2 directory itself."""
    prelude = f"import sys, json; sys.path[:0] = {[ROOT, os.path.join(ROOT, 'tests', 'frontends')]!r}; " \
              f"a, k = json.loads(sys.argv[1]), json.loads(sys.argv[2]); "
    subprocess.run([sys.executable, "-c", prelude + code, json.dumps(a), json.dumps(k)], check=True)


def make_dirs(work: str, names: list[str], genai: bool) -> dict[str, dict]:
    """Each model's Hugging Face directory (made once under ``work``) and,
    for llama with GenAI present, the GenAI model its builder makes of it."""
    out = {}
    for name in names:
        family, config = MODELS[name]
        hf = os.path.join(work, name, "hf")
        if not os.path.exists(os.path.join(hf, "config.json")):
            in_child("from hf_dirs import save_hf_dir; save_hf_dir(*a, seed=0, **k)", family, hf, **config)
        og = os.path.join(work, name, "genai")
        if genai and family != "gpt2" and not os.path.exists(os.path.join(og, "genai_config.json")):
            build_genai(hf, og, os.path.join(work, name, "genai-cache"))
        out[name] = {"hf": hf, "genai": og if genai and family != "gpt2" else None}
    return out


def build_genai(hf: str, out: str, cache: str) -> None:
    """GenAI's builder, fp32 CPU (``tests/frontends/genai_builder``)."""
    from genai_builder import build_genai as build
    build(GENAI_PYTHON, hf, out, cache)


def timed(cmd: list[str], env: dict | None = None) -> tuple[float, int, str]:
    """(wall seconds from before the process starts to after it ends, its
    peak RSS in bytes, its stdout)."""
    with tempfile.TemporaryFile("w+") as out:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, env={**os.environ, **(env or {})},
                                text=True)
        err = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd[:4])} ... failed ({proc.returncode}):\n{err[-3000:]}")
        out.seek(0)
        return wall, usage.ru_maxrss * 1024, out.read()


def run_blockc(hf: str, prompts, new: int, cache: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "gen.json")
        cmd = [sys.executable, "-m", "blockc.cli", "generate", hf, "--max-new", str(new), "--json", report]
        for p in prompts:
            cmd += ["--prompt-ids", ",".join(map(str, p))]
        wall, rss, _ = timed(cmd, {"BLOCKC_CACHE": cache, "PYTHONPATH": ROOT})
        with open(report) as f:
            got = json.load(f)
    return {"wall_s": wall, "rss": rss, "tokens": got["tokens"], "start_s": got["start_s"],
            "compile_s": got["compile_s"], "first_token_s": got["first_token_s"], "step_s": got["step_s"]}


def run_child(python: str, script: str, model: str, prompts, new: int, threads: int) -> dict:
    wall, rss, out = timed([python, "-c", script, model, json.dumps(prompts), str(new), str(threads)])
    return {"wall_s": wall, "rss": rss, **json.loads(out.strip().splitlines()[-1])}


def until_eos(rows: list[list[int]], eos: set[int]) -> list[list[int]]:
    """Each row up to and including its first stop id (Hugging Face pads a finished row, GenAI stops it)."""
    out = []
    for row in rows:
        cut = next((k + 1 for k, t in enumerate(row) if t in eos), len(row))
        out.append(row[:cut])
    return out


def eos_ids(hf: str) -> set[int]:
    with open(os.path.join(hf, "generation_config.json")) as f:
        eos = json.load(f).get("eos_token_id")
    return set(eos if isinstance(eos, list) else [eos] if eos is not None else [])


def in_empty_cache(run):
    """``run(cache)`` with an empty ``BLOCKC_CACHE`` of its own, removed after
    (a cold run's entries are about 0.6 GB: kept, a full matrix filled 30 GB)."""
    with tempfile.TemporaryDirectory(prefix="blockc-cold-") as cache:
        return run(cache)


def contestants(dirs: dict, prompts, new: int, warm_cache: str, threads: int) -> dict:
    """name -> a call that runs it once, fresh process, and returns its figures."""
    runs = {
        "blockc cold": lambda: in_empty_cache(lambda cache: run_blockc(dirs["hf"], prompts, new, cache)),
        "blockc warm": lambda: run_blockc(dirs["hf"], prompts, new, warm_cache),
        "blockc warm (A/A)": lambda: run_blockc(dirs["hf"], prompts, new, warm_cache),
        "hf": lambda: run_child(sys.executable, HF_CHILD, dirs["hf"], prompts, new, threads),
    }
    if dirs["genai"]:
        runs["genai"] = lambda: run_child(GENAI_PYTHON, GENAI_CHILD, dirs["genai"], prompts, new, threads)
    return runs


def measure_config(dirs: dict, new: int, batch: int, blocks: int, threads: int, seed: int) -> dict[str, list]:
    """Every contestant ``blocks`` times, shuffled in each block; the tokens checked equal."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(1, 390) for _ in range(PROMPT_LEN)] for _ in range(batch)]
    got: dict[str, list] = {}
    with tempfile.TemporaryDirectory(prefix="blockc-warm-") as warm:
        run_blockc(dirs["hf"], prompts, new, warm)   # fills the compile cache
        runs = contestants(dirs, prompts, new, warm, threads)
        got = {name: [] for name in runs}
        for _ in range(blocks):
            order = list(runs)
            rng.shuffle(order)
            for name in order:
                got[name].append(runs[name]())
    eos = eos_ids(dirs["hf"])
    tokens = {name: until_eos(r[0]["tokens"], eos) for name, r in got.items()}
    if len({json.dumps(t) for t in tokens.values()}) != 1:
        raise SystemExit("greedy tokens differ: " + "; ".join(f"{n}: {t[0][:12]}" for n, t in tokens.items()))
    return got


def figures(run: dict) -> dict:
    steps = run["step_s"]
    return {"wall_s": run["wall_s"], "start_s": run["start_s"], "first_token_s": run["first_token_s"],
            "per_token_s": statistics.median(steps) if steps else float("nan"), "rss": run["rss"]}


def spread(values: list[float], scale: float = 1.0, fmt: str = "{:.2f}") -> str:
    v = [x * scale for x in values]
    return f"{fmt.format(statistics.median(v))} [{fmt.format(min(v))}-{fmt.format(max(v))}]"


def verdict(ratios: list[float], limit: float, want_below: bool) -> str:
    """``ratios`` (one per block) against ``limit``: met / not met when the
    interval lies wholly on one side, else undecided."""
    r = ratio_interval(ratios)
    ok, bad = (r.high <= limit, r.low > limit) if want_below else (r.low >= limit, r.high < limit)
    word = "met" if ok else "not met" if bad else "undecided"
    if r.n < r.MIN_FOR_VERDICT:   # the house rule: fewer blocks than this resolve nothing
        word += f" (only {r.n} blocks: indicative)"
    return f"{r.ratio:.2f} [{r.low:.2f}-{r.high:.2f}] -> {word}"


def table(name: str, new: int, batch: int, got: dict[str, list]) -> list[str]:
    lines = [f"\n**{name}, prompt {PROMPT_LEN}, {new} new, batch {batch}** (median [min-max] of {len(next(iter(got.values())))} "
             "blocks)\n", "| contestant | whole run, process start to exit, s | start s | first token ms | "
             "per token ms | peak RSS GiB | tokens |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for who, runs in got.items():
        f = [figures(r) for r in runs]
        lines.append(f"| {who} | {spread([x['wall_s'] for x in f])} | {spread([x['start_s'] for x in f])} | "
                     f"{spread([x['first_token_s'] for x in f], 1e3, '{:.0f}')} | "
                     f"{spread([x['per_token_s'] for x in f], 1e3, '{:.1f}')} | "
                     f"{spread([x['rss'] for x in f], 2 ** -30)} | {sum(len(t) for t in runs[0]['tokens'])} |")
    return lines


def targets(name: str, new: int, batch: int, got: dict[str, list]) -> list[str]:
    """The issue's targets this configuration measures, each a ratio per block with its interval."""
    warm, cold = got["blockc warm"], got["blockc cold"]
    per = lambda runs: [figures(r)["per_token_s"] for r in runs]   # noqa: E731
    control = ratio_interval([a["wall_s"] / b["wall_s"] for a, b in zip(warm, got["blockc warm (A/A)"])])
    rows = [(f"cold start (trace, optimize, both sessions) <= 2 s, {name} b{batch}",
             [r["compile_s"] / 2.0 for r in cold], 1.0, True)]
    for peer in ("genai", "hf"):
        if peer in got:
            rows.append((f"whole run warm faster than {peer}, {name} {new} new b{batch} (blockc / {peer})",
                         [a["wall_s"] / b["wall_s"] for a, b in zip(warm, got[peer])], 1.0, True))
    if "genai" in got:
        rows.append((f"warm start <= GenAI's model load, {name} (blockc start / GenAI load)",
                     [a["start_s"] / b["start_s"] for a, b in zip(warm, got["genai"])], 1.0, True))
        need = 1.5 if batch == 1 else 1.0
        rows.append((f"per token >= {need}x GenAI, {name} b{batch} (GenAI / blockc)",
                     [b / a for a, b in zip(per(warm), per(got["genai"]))], need, False))
    return [f"| {what} | {verdict(r, limit, below)} |" for what, r, limit, below in rows] + \
        [f"| A/A control, {name} {new} new b{batch}: blockc warm / warm again, whole run | {control.ratio:.2f} "
         f"[{control.low:.2f}-{control.high:.2f}] (the noise alone) |"]


def builtin_gpt2(work: str, blocks: int) -> tuple[list[str], list[str]]:
    """``blockc generate gpt2 --weights gpt2.safetensors``, 128-token prompt, 8 new, cold and warm."""
    weights = os.path.join(work, "gpt2.safetensors")
    if not os.path.exists(weights):
        in_child("from blockc.frontends import build_model, init_weights, save_weights; "
                 "save_weights(a[0], init_weights(build_model('gpt2'), seed=0))", weights)
    ids = ",".join(str(i * 37 % 50000) for i in range(PROMPT_LEN))
    cmd = [sys.executable, "-m", "blockc.cli", "generate", "gpt2", "--weights", weights, "--prompt-ids", ids,
           "--max-new", "8"]
    run = lambda cache: timed(cmd, {"BLOCKC_CACHE": cache, "PYTHONPATH": ROOT})[:2]   # noqa: E731
    got = {"cold": [], "warm": []}
    with tempfile.TemporaryDirectory(prefix="blockc-warm-") as warm:
        run(warm)
        for _ in range(blocks):
            for kind in random.sample(list(got), 2):
                got[kind].append(run(warm) if kind == "warm" else in_empty_cache(run))
    lines = [f"| `blockc generate gpt2 --weights` {kind} | {spread([w for w, _ in runs])} s | "
             f"peak RSS {spread([m for _, m in runs], 2 ** -30)} GiB |" for kind, runs in got.items()]
    rows = [f"| gpt2 --weights, 8 new, {kind} <= {limit} s | {verdict([w / limit for w, _ in got[kind]], 1.0, True)} |"
            for kind, limit in (("cold", 5.0), ("warm", 2.0))]
    return lines, rows


def default_compare(runs: int) -> list[str]:
    """The default ``blockc compare`` (no arguments) ``runs`` times, each a fresh
    process with an empty ``BLOCKC_CACHE``, as a new user first meets it."""
    if not runs:
        return ["| default `blockc compare` <= 60 s | not measured here (`--compare N` times it) |"]
    walls = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, "-m", "blockc.cli", "compare", "--no-progress", "--json",
                   os.path.join(tmp, "r.json")]
            walls.append(timed(cmd, {"BLOCKC_CACHE": os.path.join(tmp, "cache"), "PYTHONPATH": ROOT})[0])
    return [f"| default `blockc compare` <= 60 s, empty cache (wall {spread(walls)} s) | "
            f"{verdict([w / 60.0 for w in walls], 1.0, True)} |"]


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="llama only, 64 new, batch 1, 3 blocks, and gpt2 --weights")
    ap.add_argument("--models", default="llama,gpt2")
    ap.add_argument("--new", default="64,512")
    ap.add_argument("--batch", default="1,4")
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch's threads (ONNX Runtime's default "
                    "is one per core)")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "blockc-generate-e2e"),
                    help="where the model directories are made once and kept")
    ap.add_argument("--json", help="write every run's figures here")
    ap.add_argument("--compare", type=int, default=0, metavar="N",
                    help="also time the default `blockc compare` N times (about 45 s each)")
    args = ap.parse_args()
    if args.quick:
        args.models, args.new, args.batch, args.blocks = "llama", "64", "1", 3
    return args


def main() -> None:
    args = parse_args()
    if not GENAI_PYTHON:
        print("BLOCKC_GENAI_PYTHON is not set: ONNX Runtime GenAI is left out (it names a Python with "
              "onnxruntime-genai)", file=sys.stderr)
    from importlib.metadata import version   # torch not imported here: a child's peak RSS starts at this size
    import onnxruntime   # its distribution has several names (onnxruntime-gpu)
    os.makedirs(args.work, exist_ok=True)
    names = args.models.split(",")
    dirs = make_dirs(args.work, names, bool(GENAI_PYTHON))
    out = [f"{cpu_name()}, {os.cpu_count()} cores; Python {platform.python_version()}, onnxruntime "
           f"{onnxruntime.__version__}, torch {version('torch')}, transformers {version('transformers')}; "
           f"`python bench/{os.path.basename(__file__)} {' '.join(sys.argv[1:])}`. GenAI's builder has no GPT-2. "
           "torch's CPU GEMMs can be 2-3x slower than ONNX Runtime's."]
    rows, record = [], {}
    for name in names:
        for new in map(int, args.new.split(",")):
            for batch in map(int, args.batch.split(",")):
                got = measure_config(dirs[name], new, batch, args.blocks, args.threads, seed=batch)
                record[f"{name}-{new}-b{batch}"] = got
                out += table(name, new, batch, got)
                rows += targets(name, new, batch, got)
    lines, gpt2_rows = builtin_gpt2(args.work, args.blocks)
    out += ["\n| run | wall | |", "| --- | --- | --- |", *lines]
    out += ["\n| target (issue 24) | ratio to the target, geometric mean [95% interval] |", "| --- | --- |",
            *rows, *gpt2_rows, *default_compare(args.compare)]
    print("\n".join(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
