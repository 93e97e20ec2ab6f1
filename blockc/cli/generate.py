"""``blockc generate``: tokens from a decoder model with a KV cache."""
from __future__ import annotations

from ..errors import BlockcError
from .common import int_list, load_model, make_weights, write_text
from .options import form_arg, json_arg, model_args, tp_args, weights_args

NAME = "generate"
HELP = "generate tokens with a KV cache"
DESCRIPTION = ("Generate up to --max-new tokens after each --prompt-ids with a decoder model (gpt2, tiny, "
               "llama-tiny, qwen3-tiny or your own DecoderLM): the prompts are batched left-padded, a prefill graph "
               "runs once and a decode graph per token, feeding back the key/value cache. Prints each prompt's new "
               "ids (redrawn as they come on a terminal), then the time to the first token, each decode step's "
               "median and p90, and tokens per second.")


def add_arguments(p) -> None:
    from ..runtime.backend import backend_names
    model_args(p)
    tp_args(p)
    form_arg(p, default="fused")
    p.add_argument("--prompt-ids", action="append", required=True, metavar="IDS",
                   help="one prompt's token ids, comma-separated, e.g. 1,2,3 (repeatable: one prompt each)")
    p.add_argument("--max-new", type=int, default=32, help="new tokens per prompt, at most (default 32)")
    _sampling_args(p)
    p.add_argument("--stop-id", type=int, metavar="ID", help="a prompt stops after this token id")
    p.add_argument("--cache", choices=("inplace", "concat"), default="inplace",
                   help="inplace (default): each layer's cache preallocated and written in place by the decode "
                   "step, kept by the backend between steps; concat: a new, one-row-longer cache every step")
    p.add_argument("--cache-len", type=int, metavar="N", help="positions the in-place cache holds (default: the "
                   "longest prompt and --max-new; fewer is refused)")
    p.add_argument("--backend", choices=backend_names(), default="ort-cpu",
                   help="where the graphs run (default ort-cpu): reference, ort-cpu, cuda-emu, ...")
    weights_args(p, seeds="the weights (where made, not read from --weights) and of sampling")
    json_arg(p, what="the ids and timings")


def _sampling_args(p) -> None:
    """How the next token is picked: greedy, or sampled with a temperature, top-k and top-p."""
    pick = p.add_mutually_exclusive_group()
    pick.add_argument("--greedy", action="store_true", help="pick the most likely token (the default)")
    pick.add_argument("--temperature", type=float, metavar="T",
                      help="sample instead: divide the logits by T (> 0; 0 is greedy), as Hugging Face's do_sample")
    p.add_argument("--top-k", type=int, default=0, metavar="K", help="sampling: keep the K most likely (default 0: all)")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P",
                   help="sampling: keep the fewest most likely tokens whose probability reaches P, in (0, 1] "
                        "(default 1: all)")
    p.add_argument("--repetition-penalty", type=float, default=1.0, metavar="R",
                   help="scores of ids already in a row divided (positive) or multiplied (negative) by R "
                        "(default 1: none); applies to greedy picks too")


def run(args) -> int:
    import json
    from ..generate.loop import cache_length, check_request, generate
    from ..generate.sampling import Sampler
    from ..generate.stream import TokenLines, format_timings
    from ..runtime.backend import make_backend
    prompts = [list(int_list("--prompt-ids", text)) for text in args.prompt_ids]
    sampling = args.temperature is not None and args.temperature != 0
    if not sampling and (args.top_k or args.top_p != 1.0):
        raise BlockcError("--top-k and --top-p filter what is sampled: give --temperature T (> 0) with them")
    # temperature 0 (or none): greedy, after any repetition penalty, as Hugging Face's do_sample=False
    pick = Sampler(args.temperature or 0.0, args.top_k, args.top_p, args.repetition_penalty, seed=args.seed)
    model = load_model(args)
    check_request(model, prompts, args.max_new)   # before any weights are made
    cache_length(model, prompts, args.max_new, args.cache, args.cache_len)
    if args.tp is not None:
        return _generate_on_ranks(args, prompts)
    make_backend(args.backend).require()
    lines = TokenLines(len(prompts))
    result = generate(model, make_weights(args, model), prompts, args.max_new, backend=args.backend, pick=pick,
                      stop_id=args.stop_id, on_token=lines, form=args.form, cache=args.cache,
                      cache_len=args.cache_len)
    lines.finish(result.tokens)
    print(format_timings(result))
    if args.json:
        write_text(args.json, json.dumps({"model": args.model, "prompts": prompts, **result.as_json()},
                                         indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def _generate_on_ranks(args, prompts: list[list[int]]) -> int:
    """``--tp N``: the model split over N ranks (``cli/tensor_parallel.py``); each prompt's new ids."""
    import json
    from ..generate.stream import TokenLines
    from .tensor_parallel import generate_ranks
    tokens = generate_ranks(args, prompts)
    TokenLines(len(prompts)).finish(tokens)
    if args.json:
        write_text(args.json, json.dumps({"model": args.model, "prompts": prompts, "tp": args.tp,
                                          "tokens": tokens}, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0
