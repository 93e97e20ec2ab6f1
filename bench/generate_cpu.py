"""Generation on ONNX Runtime CPU beside Hugging Face ``generate``'s steps on torch CPU.

Issue 12's figures, at batch 1: time to first token for a 128-token prompt
(the prefill and the first pick), and the time of one decode step at a
cache of ``past`` tokens, for blockc's fused and unfused (standard) graphs
and for the Hugging Face model with the same weights. Targets: the decode
step at past 1000 costs at most 1.5x the step at past 64 (the cache is
neither recomputed nor copied), and blockc's fused step is faster than
Hugging Face's at every past.

A decode step at a given past is measured on a cache of that length (random
keys and values: the step's cost does not depend on them), not by
generating a thousand tokens: the same step, repeated. blockc's step is
what the generation loop runs for one prompt (``blockc.generate``): the
unpadded graphs (no key mask: no row has a pad), the cache kept by
the compiled graph between steps (``Compiled.cached``); with ``--cache
concat`` instead it is the plain decode graph, its cache fed as numpy
arrays and returned as new ones (the loop before the in-place cache).
Hugging Face's step is ``model(token, past_key_values=DynamicCache)`` under
``torch.inference_mode``, the cache cropped back to ``past`` after each
step (a view, no copy), with ``torch.set_num_threads`` equal to ONNX
Runtime's threads. Its weights are a randomly initialised transformers
model's, mapped into blockc (``frontends/hf_gpt2.py``, ``hf_llama.py``), so
both run the same numbers.

House standard (``bench/cpu_targets.py``): ``--blocks`` independent
repetitions, each preparing fresh ONNX Runtime sessions of every contestant
in shuffled order and timing them in interleaved rounds
(``timing.measure_in_blocks``); a ratio is the geometric mean over blocks
with a 95% bootstrap interval (``timing.ratio_interval``), with an A/A
control (a second fused session against the first). One session per graph
and block serves every past (the past is a feed).

    python bench/generate_cpu.py [--models gpt2,llama-tiny:max_positions=1024] [--pasts 64,512,1000]
                                 [--prompt 128] [--blocks 6] [--threads 2] [--quick] [--json FILE]

Prints markdown for docs/PERFORMANCE.md. On this machine's CPUs torch's
GEMMs are often 2-3x slower than ONNX Runtime's (MLAS), so the ratio to
Hugging Face partly measures the GEMM library, not the cache.
"""
from __future__ import annotations

import argparse
import warnings
import json
import os
import statistics
import sys
import time

import numpy as np
import onnxruntime
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.cpu_targets import parse_model  # noqa: E402
from blockc.codegen.onnx_export import export_onnx  # noqa: E402
from blockc.compare.machine import cpu_name  # noqa: E402
from blockc.frontends import build_model, trace  # noqa: E402
from blockc.frontends.hf_gpt2 import load_hf_gpt2_state_dict  # noqa: E402
from blockc.frontends.hf_llama import load_hf_llama_state_dict  # noqa: E402
from blockc.generate.loop import cache_names, into_cache, padded  # noqa: E402
from blockc.passes.forms import to_form  # noqa: E402
from blockc.runtime.ort_runner import OrtCachedStep, session_options  # noqa: E402
from blockc.runtime.timing import measure_in_blocks, paired_speedup, ratio_interval  # noqa: E402

FORMS = ("fused", "standard")


def hf_twin(name: str, sets: dict):
    """The blockc model, a randomly initialised transformers model of the
    same shape, and blockc weights mapped from it."""
    model = build_model(name, sets)
    cfg = model.cfg
    torch.manual_seed(0)
    if cfg.positions == "rope":
        config = transformers.LlamaConfig(
            vocab_size=cfg.vocab, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff, num_hidden_layers=cfg.layers,
            num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads or cfg.heads,
            max_position_embeddings=cfg.max_positions, rms_norm_eps=cfg.eps, rope_theta=cfg.rope_theta,
            tie_word_embeddings=cfg.tie_embeddings, bos_token_id=None, eos_token_id=None)
        hf = transformers.LlamaForCausalLM(config).eval()
        return model, load_hf_llama_state_dict(hf.state_dict(), model), hf
    config = transformers.GPT2Config(n_layer=cfg.layers, n_embd=cfg.d_model, n_head=cfg.heads, vocab_size=cfg.vocab,
                                     n_positions=cfg.max_positions, bos_token_id=None, eos_token_id=None)
    hf = transformers.GPT2LMHeadModel(config).eval()
    return model, load_hf_gpt2_state_dict(hf.state_dict(), model), hf


def step_feeds(model, past: int, rng) -> dict[str, np.ndarray]:
    """One decode step's feeds at batch 1 after ``past`` tokens, with a random cache."""
    cfg = model.cfg
    feeds = {"input_ids": np.array([[7]], np.int64), "attention_mask": np.ones((1, past + 1), np.int64),
             "position_ids": np.array([[past]], np.int64)}
    shape = (1, cfg.kv_heads or cfg.heads, past, cfg.head_size)
    for past_name, _ in cache_names(cfg.layers):
        feeds[past_name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


class Sessions:
    """One fresh ONNX Runtime session per graph and block, shared by the
    contestants that run it (every past), closed when the last one closes."""

    def __init__(self, protos, threads):
        self.protos, self.threads, self.open, self.users = protos, threads, {}, {}

    def get(self, key):
        if key not in self.open:
            self.open[key] = onnxruntime.InferenceSession(self.protos[key[0]], session_options("all", self.threads),
                                                          providers=["CPUExecutionProvider"])
        self.users[key] = self.users.get(key, 0) + 1
        return self.open[key]

    def release(self, key):
        self.users[key] -= 1
        if not self.users[key]:
            del self.open[key]


def blockc_decode(sessions, key, model, graph, past, cache_len, mode):
    def prepare():
        session = sessions.get(key)
        feeds = step_feeds(model, past, np.random.default_rng(past))
        if mode == "concat":
            run = lambda: session.run(None, feeds)   # noqa: E731
            return run, lambda: sessions.release(key)
        # What generate() runs: the cache in buffers of cache_len rows, bound in and out of the session.
        names = cache_names(model.cfg.layers)
        step = OrtCachedStep(session, graph, {present: past_name for past_name, present in names},
                             {past_name: into_cache(feeds.pop(past_name), cache_len) for past_name, _ in names})
        run = step.runner(feeds)

        def close():
            step.close()
            sessions.release(key)
        return run, close
    return prepare


def blockc_prefill(sessions, key, prompt):
    def prepare():
        session = sessions.get(key)
        feeds = {"input_ids": prompt, "attention_mask": np.ones_like(prompt),
                 "position_ids": np.arange(prompt.shape[1], dtype=np.int64)[None]}
        names = [o.name for o in session.get_outputs()]

        def run():
            out = session.run(None, feeds)
            return np.argmax(out[names.index("logits")][:, -1], -1)
        return run, lambda: sessions.release(key)
    return prepare


def hf_decode(hf, model, past):
    def prepare():
        from transformers import DynamicCache
        cfg, rng = model.cfg, torch.Generator().manual_seed(past)
        cache = DynamicCache()
        shape = (1, cfg.kv_heads or cfg.heads, past, cfg.head_size)
        for layer in range(cfg.layers):
            cache.update(torch.randn(shape, generator=rng), torch.randn(shape, generator=rng), layer)
        token, mask = torch.tensor([[7]]), torch.ones((1, past + 1), dtype=torch.long)

        def run():
            with torch.inference_mode():
                logits = hf(input_ids=token, attention_mask=mask, past_key_values=cache, use_cache=True).logits
            cache.crop(-1)   # back to past tokens (this transformers takes the count to remove)
            return int(logits[0, -1].argmax())
        return run, lambda: None
    return prepare


def hf_prefill(hf, prompt):
    ids = torch.from_numpy(prompt)

    def prepare():
        def run():
            with torch.inference_mode():
                return int(hf(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True).logits[0, -1].argmax())
        return run, lambda: None
    return prepare


def cell(iv) -> str:
    return f"{iv.ratio:.3f}x [{iv.low:.3f}–{iv.high:.3f}] {iv.verdict}"


def growth(iv, target: float = 1.5) -> str:
    """A step's time over the first past's, against the target (the whole interval on one side)."""
    verdict = "met" if iv.high <= target else "not met" if iv.low > target else "unresolved"
    return f"{iv.ratio:.3f}x [{iv.low:.3f}–{iv.high:.3f}] {verdict}"


def measure_model(spec, args):
    name, sets = parse_model(spec)
    model, weights, hf = hf_twin(name, sets)
    pasts = [int(p) for p in args.pasts.split(",")]
    cache_len = max(pasts) + 1
    if cache_len > model.cfg.max_positions:
        raise SystemExit(f"{spec}: past {max(pasts)} needs max_positions > {max(pasts)} (--models {name}:max_positions=...)")
    graphs, protos = {}, {}
    # one prompt, no pads: the unpadded graphs, as generate() picks them (no key mask)
    pad = padded([[0] * args.prompt])
    for form in FORMS:
        graphs[form] = to_form(trace(model.for_cache("prefill", padded=pad)), form)
        protos[f"prefill-{form}"] = export_onnx(graphs[form], weights).SerializeToString()
        decode = model.for_cache("decode", padded=pad) if args.cache == "concat" else \
            model.for_cache("decode", cache_len=cache_len, padded=pad)
        graphs[f"decode-{form}"] = to_form(trace(decode), form)
        protos[f"decode-{form}"] = export_onnx(graphs[f"decode-{form}"], weights).SerializeToString()
    sessions = Sessions(protos, args.threads)
    prompt = np.random.default_rng(1).integers(0, model.cfg.vocab, (1, args.prompt)).astype(np.int64)
    makers = {}
    for form in FORMS:
        makers[f"ttft {form}"] = blockc_prefill(sessions, (f"prefill-{form}", 0), prompt)
        for past in pasts:
            makers[f"{form}@{past}"] = blockc_decode(sessions, (f"decode-{form}", 0), model, graphs[f"decode-{form}"],
                                                     past, cache_len, args.cache)
    makers[f"fused (A/A)@{pasts[0]}"] = blockc_decode(sessions, ("decode-fused", 1), model, graphs["decode-fused"],
                                                      pasts[0], cache_len, args.cache)
    makers["ttft hf"] = hf_prefill(hf, prompt)
    for past in pasts:
        makers[f"hf@{past}"] = hf_decode(hf, model, past)
    torch.set_num_threads(args.threads)
    blocks = measure_in_blocks(makers, blocks=args.blocks, rounds=args.rounds, warmup=2, min_time_s=args.min_time,
                               progress=lambda it: it)
    ms = {n: statistics.median(x for blk in blocks for x in blk[n].samples) * 1e3 for n in makers}

    def interval(a, b):   # a's time over b's, per block: above 1, b is faster
        return ratio_interval([paired_speedup(blk[a], blk[b]) for blk in blocks])

    rows = []
    for past in pasts:
        rows.append({"past": past, "ms": {f: ms[f"{f}@{past}"] for f in (*FORMS, "hf")},
                     "fused vs hf": interval(f"hf@{past}", f"fused@{past}"),
                     "fused vs standard": interval(f"standard@{past}", f"fused@{past}"),
                     "fused growth": interval(f"fused@{past}", f"fused@{pasts[0]}"),
                     "standard growth": interval(f"standard@{past}", f"standard@{pasts[0]}")})
    aa = interval(f"fused (A/A)@{pasts[0]}", f"fused@{pasts[0]}")
    ttft = {"ms": {f: ms[f"ttft {f}"] for f in (*FORMS, "hf")}, "fused vs hf": interval("ttft hf", "ttft fused")}
    return rows, aa, ttft


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gpt2,llama-tiny:max_positions=1024")
    ap.add_argument("--pasts", default="64,512,1000")
    ap.add_argument("--prompt", type=int, default=128, help="prompt length for the time to first token")
    ap.add_argument("--cache", choices=("inplace", "concat"), default="inplace",
                    help="inplace: the cache kept by the session between steps; concat: fed and returned as arrays")
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=0.4, help="seconds measured per contestant per block")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="3 blocks of 0.15 s: a smoke run, too short for verdicts")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", category=FutureWarning)   # transformers renaming past_key_values
    if args.quick:
        args.blocks, args.min_time = 3, 0.15
    print(f"onnxruntime {onnxruntime.__version__} CPU (level all), torch {torch.__version__}, transformers "
          f"{transformers.__version__}; {args.threads} threads each; {cpu_name()}, {time.strftime('%Y-%m-%d')}")
    print(f"command: python {' '.join(sys.argv)}")
    print(f"batch 1; cache: {args.cache}; {args.blocks} blocks of fresh sessions, {args.rounds} interleaved rounds "
          "each; ratios are geometric means over blocks with 95% bootstrap intervals. torch's GEMMs can be 2-3x "
          "slower than ONNX Runtime's here: the ratio to Hugging Face partly measures the GEMM library.\n")
    records = []
    for spec in args.models.split(","):
        rows, aa, ttft = measure_model(spec, args)
        print(f"### {spec}\n")
        print(f"time to first token ({args.prompt}-token prompt): fused {ttft['ms']['fused']:.2f} ms, standard "
              f"{ttft['ms']['standard']:.2f} ms, Hugging Face {ttft['ms']['hf']:.2f} ms; fused vs Hugging Face "
              f"{cell(ttft['fused vs hf'])}\n")
        print("| past | fused ms | standard ms | HF ms | fused vs HF | fused vs standard | fused / fused@first "
              "(time) | standard / standard@first (time) |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in rows:
            print(f"| {r['past']} | {r['ms']['fused']:.2f} | {r['ms']['standard']:.2f} | {r['ms']['hf']:.2f} | "
                  f"{cell(r['fused vs hf'])} | {cell(r['fused vs standard'])} | {growth(r['fused growth'])} | "
                  f"{growth(r['standard growth'])} |")
        print(f"\nA/A control (a second fused session at past {rows[0]['past']}): {cell(aa)}\n", flush=True)
        records.append({"model": spec, "ttft": {"ms": ttft["ms"], "fused vs hf": vars(ttft["fused vs hf"])},
                        "aa": vars(aa), "rows": [{k: (vars(v) if hasattr(v, "ratio") else v) for k, v in r.items()}
                                                  for r in rows]})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "cache": args.cache, "blocks": args.blocks, "models": records},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
