"""A Hugging Face directory's ``generation_config.json``: when to stop and
how to pick, unless the user says otherwise, as ``model.generate()`` does.

``read_generation_config(path)`` reads the file (or, where there is none,
the same fields of ``config.json``, as transformers' ``from_model_config``),
filling what it leaves unset with transformers' global defaults
(``GenerationConfig._get_default_generation_params``: greedy, temperature 1,
top-k 50, top-p 1, no min-p, no repetition penalty, no n-gram ban).
``eos_token_id`` may be one id or a list: a row stops after any of them.

``make_sampler`` then applies the user's choices over it, as flags over a
file (HF's rule: what the call gives overrides the file): ``greedy=True`` or
a ``temperature`` of 0 picks greedily, a positive ``temperature`` samples,
and ``top_k``, ``top_p``, ``min_p``, ``repetition_penalty`` and
``no_repeat_ngram_size`` replace the file's where given; with neither, the
file's ``do_sample`` decides. The result is a ``Sampler`` whose
``processors`` are the list HF builds from the same settings.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import BlockcError
from ..frontends.json_files import read_json
from .processors import LogitsProcessor
from .sampling import Sampler

GENERATION_FILE = "generation_config.json"
MODEL_CONFIG_FILE = "config.json"


@dataclass(frozen=True)
class GenerationDefaults:
    """What a directory asks of generation; ``eos_ids`` empty: no stop id."""

    eos_ids: tuple[int, ...] = ()
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    min_p: float | None = None
    no_repeat_ngram_size: int = 0

# each field a generation config may set, and the JSON types it may have
_KINDS = {"do_sample": (bool,), "top_k": (int,), "temperature": (int, float), "top_p": (int, float),
          "min_p": (int, float), "repetition_penalty": (int, float), "no_repeat_ngram_size": (int,)}


def _eos_ids(value, where: Path) -> tuple[int, ...]:
    if value is None:
        return ()
    ids = value if isinstance(value, list) else [value]
    if any(isinstance(t, bool) or not isinstance(t, int) for t in ids):
        raise BlockcError(f"{where}: eos_token_id must be a token id or a list of them, got {value!r}")
    return tuple(ids)


def read_generation_config(path) -> GenerationDefaults:
    """The generation defaults of the Hugging Face directory at ``path``."""
    path = Path(path)
    file = path / GENERATION_FILE
    if not file.is_file():
        file = path / MODEL_CONFIG_FILE
        if not file.is_file():
            return GenerationDefaults()
    fields = read_json(file, "generation settings")
    given = {name: fields[name] for name in _KINDS if fields.get(name) is not None}
    for name, value in given.items():
        if not isinstance(value, _KINDS[name]) or (name != "do_sample" and isinstance(value, bool)):
            raise BlockcError(f"{file}: {name} must be a {_KINDS[name][-1].__name__}, got {value!r}")
    return GenerationDefaults(eos_ids=_eos_ids(fields.get("eos_token_id"), file), **given)


def _given(value, default):
    return default if value is None else value


def make_sampler(defaults: GenerationDefaults, *, greedy: bool = False, temperature: float | None = None,
                 top_k: int | None = None, top_p: float | None = None, min_p: float | None = None,
                 repetition_penalty: float | None = None, no_repeat_ngram_size: int | None = None,
                 extra: Sequence[LogitsProcessor] = (), seed: int = 0) -> Sampler:
    """The ``pick`` for ``generate``: the user's choices over the directory's
    defaults (see the module); ``extra``: the user's own processors."""
    # temperature 0 means greedy; a negative or NaN one goes on to Sampler, which refuses it
    sample = defaults.do_sample if temperature is None else temperature != 0
    sample = sample and not greedy
    if not sample and (top_k is not None or top_p is not None or min_p is not None):
        raise BlockcError("--top-k, --top-p and --min-p filter what is sampled: give --temperature T (> 0) with them")
    unsampled = dict(repetition_penalty=_given(repetition_penalty, defaults.repetition_penalty),
                     no_repeat_ngram_size=_given(no_repeat_ngram_size, defaults.no_repeat_ngram_size),
                     extra=extra, seed=seed)
    if not sample:   # HF's do_sample=False: greedy, after the repetition penalty and the n-gram ban
        return Sampler(0.0, **unsampled)
    return Sampler(_given(temperature, defaults.temperature), _given(top_k, defaults.top_k),
                   _given(top_p, defaults.top_p), min_p=_given(min_p, defaults.min_p), **unsampled)
