"""``blockc generate``: tokens (or text) from a decoder model with a KV cache."""
from __future__ import annotations

import time

from ..errors import BlockcError
from .common import hf_dir_of, int_list, load_model, make_weights, write_text
from .options import form_arg, json_arg, model_args, tp_args, tp_backends_help, weights_args

NAME = "generate"
HELP = "generate tokens with a KV cache"
DESCRIPTION = ("Generate up to --max-new tokens after each --prompt (text, from a Hugging Face directory) or "
               "--prompt-ids with a decoder model (gpt2, tiny, llama-tiny, qwen3-tiny, your own DecoderLM, a Hugging "
               "Face directory or an ONNX decoder file): the prompts are batched left-padded, a prefill graph "
               "runs once and a decode graph per token, feeding back the key/value cache. Prints each prompt's new "
               "text or ids (redrawn as they come on a terminal), then the whole run, its start (loading the "
               "weights and compiling), the time to the first token, each decode step's median and p90, and "
               "tokens per second.")


def add_arguments(p) -> None:
    from ..runtime.backend import backend_names
    model_args(p)
    tp_args(p)
    form_arg(p, default="fused")
    _prompt_args(p)
    p.add_argument("--max-new", type=int, default=32, help="new tokens per prompt, at most (default 32)")
    _sampling_args(p)
    _stopping_args(p)
    p.add_argument("--cache", choices=("inplace", "concat"), default="inplace",
                   help="inplace (default): each layer's cache preallocated and written in place by the decode "
                   "step, kept by the backend between steps; concat: a new, one-row-longer cache every step")
    p.add_argument("--cache-len", type=int, metavar="N", help="positions the in-place cache holds (default: the "
                   "longest prompt and --max-new; fewer is refused)")
    p.add_argument("--cache-pairs", metavar="PAST=PRESENT,...",
                   help="an ONNX decoder file's cache inputs and outputs in pairs, where neither genai_config.json "
                        "nor their names give them")
    p.add_argument("--backend", choices=backend_names(),
                   help=f"where the graphs run (default ort-cpu; {tp_backends_help()}): reference, ort-cpu, "
                        f"cuda-emu, ...")
    weights_args(p, seeds="the weights (where made, not read from --weights) and of sampling")
    json_arg(p, what="the ids (and texts) and timings")


def _prompt_args(p) -> None:
    """What is generated after: text through the directory's tokenizer (and chat template), or ids."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt-ids", action="append", metavar="IDS",
                     help="one prompt's token ids, comma-separated, e.g. 1,2,3 (repeatable: one prompt each)")
    src.add_argument("--prompt", action="append", metavar="TEXT",
                     help="one prompt as text, tokenized by the model directory's tokenizer.json as Hugging Face's "
                          "AutoTokenizer does (repeatable: one prompt each)")
    p.add_argument("--chat", action="store_true", help="each --prompt is a user message rendered by the directory's "
                   "chat template, as apply_chat_template(messages, add_generation_prompt=True)")
    p.add_argument("--system", metavar="TEXT", help="with --chat: a system message before each prompt")
    p.add_argument("--skip-special-tokens", action="store_true", help="leave special tokens (the eos) out of the text")


def _sampling_args(p) -> None:
    """How the next token is picked: greedy, or sampled with a temperature, top-k, top-p and min-p."""
    pick = p.add_mutually_exclusive_group()
    pick.add_argument("--greedy", action="store_true",
                      help="pick the most likely token (the default, unless generation_config.json samples)")
    pick.add_argument("--temperature", type=float, metavar="T",
                      help="sample instead: divide the logits by T (> 0; 0 is greedy), as Hugging Face's do_sample")
    p.add_argument("--top-k", type=int, metavar="K", help="sampling: keep the K most likely "
                   "(default: the directory's generation_config.json, else 0: all)")
    p.add_argument("--top-p", type=float, metavar="P",
                   help="sampling: keep the fewest most likely tokens whose probability reaches P, in (0, 1] "
                        "(default: the directory's generation_config.json, else 1: all)")
    p.add_argument("--min-p", type=float, metavar="P", help="sampling: drop tokens less likely than P times the most "
                   "likely, in [0, 1] (default: none), as Hugging Face's min_p")
    p.add_argument("--repetition-penalty", type=float, metavar="R",
                   help="scores of ids already in a row divided (positive) or multiplied (negative) by R "
                        "(default: the directory's generation_config.json, else 1: none); applies to greedy picks too")
    p.add_argument("--no-repeat-ngram-size", type=int, metavar="N", help="no N-gram of ids occurs twice in a row, "
                   "the prompt's included (default: none); applies to greedy picks too")


def _stopping_args(p) -> None:
    p.add_argument("--stop-id", type=int, action="append", metavar="ID", help="a prompt stops after this token id "
                   "(repeatable; default: generation_config.json's eos_token_id)")
    p.add_argument("--stop", action="append", metavar="TEXT", help="a prompt stops once its text ends in TEXT "
                   "(repeatable; needs the model's tokenizer), as Hugging Face's stop_strings")
    p.add_argument("--max-time", type=float, metavar="S", help="every prompt stops once S seconds have passed since "
                   "the prefill began, as Hugging Face's max_time")


def run(args) -> int:
    from ..generate.generation_config import GenerationDefaults, make_sampler, read_generation_config
    from ..generate.loop import cache_length, check_request
    from ..generate.stopping import user_criteria
    from ..generate.stream import TextLines, TokenLines, format_timings
    from ..runtime.backend import make_backend
    if args.tp is not None:
        from .tensor_parallel import check_generate_ranks
        check_generate_ranks(args)
    args.backend = args.backend or "ort-cpu"
    directory = hf_dir_of(args)
    tokenizer = _tokenizer(args, directory)
    prompts = _prompts(args, tokenizer)
    # a built-in model has no generation_config: top_k=0 keeps --temperature alone sampling from all tokens
    defaults = read_generation_config(directory) if directory else GenerationDefaults(top_k=0)
    pick = make_sampler(defaults, greedy=args.greedy, temperature=args.temperature, top_k=args.top_k,
                        top_p=args.top_p, min_p=args.min_p, repetition_penalty=args.repetition_penalty,
                        no_repeat_ngram_size=args.no_repeat_ngram_size, seed=args.seed)
    stopping = user_criteria(stop=args.stop, max_time=args.max_time, decode=tokenizer.decode if tokenizer else None)
    model = _decoder(args)
    check_request(model, prompts, args.max_new)   # before any weights are made
    cache_length(model, prompts, args.max_new, args.cache, args.cache_len)
    make_backend(args.backend).require()
    lines = (TextLines(tokenizer, len(prompts), skip_special_tokens=args.skip_special_tokens) if tokenizer
             else TokenLines(len(prompts)))
    choices = dict(pick=pick, stop_id=args.stop_id or defaults.eos_ids, stopping=stopping)
    result = _generate(args, model, prompts, choices, lines)
    texts = lines.finish(result.tokens)
    print(format_timings(result))
    if args.json:
        _write_json(args, prompts, result, texts)
    return 0


def _generate(args, model, prompts, choices: dict, lines):
    """The ``Generation``, its lines drawn as tokens come: on one process,
    or with --tp on its ranks (``cli/tensor_parallel.py``)."""
    if args.tp is not None:
        from .tensor_parallel import generate_ranks
        return generate_ranks(args, prompts, choices, on_token=lines)
    from ..generate.loop import generate
    t0 = time.perf_counter()
    weights = _weights(args, model)
    load_s = time.perf_counter() - t0
    return generate(model, weights, prompts, args.max_new, backend=args.backend, on_token=lines, form=args.form,
                    cache=args.cache, cache_len=args.cache_len, load_s=load_s, **choices)


def _tokenizer(args, directory):
    """The directory's tokenizer where --prompt gives text; --chat and --system need it."""
    if not args.prompt:
        if args.chat or args.system is not None:
            raise BlockcError("--chat and --system render text prompts: give --prompt TEXT, not --prompt-ids")
        return None
    if directory is None:
        raise BlockcError(f"--prompt needs a Hugging Face directory as MODEL, for its tokenizer.json "
                          f"(not {args.model!r}): give token ids with --prompt-ids")
    from ..generate.text import TextTokenizer
    return TextTokenizer.from_dir(directory)


def _prompts(args, tokenizer) -> list[list[int]]:
    if tokenizer is None:
        return [list(int_list("--prompt-ids", text)) for text in args.prompt_ids]
    from ..generate.chat import encode_prompts
    return encode_prompts(tokenizer, args.prompt, chat=args.chat, system=args.system)


def _decoder(args):
    """The model as ``generate`` drives it, its file read once; an ONNX file's
    cache pairs as --cache-pairs gives them."""
    from ..generate.decoder import as_decoder
    if args.cache_pairs is None:
        return as_decoder(load_model(args))
    if not args.model.lower().endswith(".onnx"):
        raise BlockcError(f"--cache-pairs names an ONNX decoder file's cache inputs and outputs: "
                          f"{args.model!r} is not an .onnx file")
    from ..frontends.onnx.decoder import OnnxDecoder
    return OnnxDecoder(args.model, pairs=cache_pairs(args.cache_pairs))


def _weights(args, model):
    """The weights: an ONNX decoder's are its file's (--weights replaces them, as on any ONNX model)."""
    from ..frontends.models import DecoderLM   # not the ONNX frontend: a DecoderLM's run never imports it
    return make_weights(args, model if isinstance(model, DecoderLM) else model.model)


def cache_pairs(text: str) -> list[tuple[str, str]]:
    """``"past.0=present.0,past.1=present.1"`` -> its pairs; a malformed pair is refused."""
    pairs = []
    for item in text.split(","):
        past, eq, present = (s.strip() for s in item.partition("="))
        if not (eq and past and present):
            raise BlockcError(f"malformed --cache-pairs item {item!r}: expected PAST=PRESENT, "
                              f"e.g. --cache-pairs past_key_values.0.key=present.0.key")
        pairs.append((past, present))
    return pairs


def _write_json(args, prompts, result, texts) -> None:
    import json
    text = {"prompt_text": args.prompt, "text": texts} if texts is not None else {}
    ranks = {"tp": args.tp} if args.tp is not None else {}
    write_text(args.json, json.dumps({"model": args.model, "prompts": prompts, **ranks, **result.as_json(), **text},
                                     indent=2) + "\n")
    print(f"wrote {args.json}")
