"""A Hugging Face directory's ``generation_config.json``: when to stop and
how to pick, unless the user says otherwise, as ``model.generate()`` does.

``read_generation_config(path)`` reads the file (or, where there is none,
the same fields of ``config.json``, as transformers' ``from_model_config``),
filling what it leaves unset with transformers' global defaults
(``GenerationConfig._get_default_generation_params``: greedy, temperature 1,
top-k 50, top-p 1, no repetition penalty). ``eos_token_id`` may be one id or
a list: a row stops after any of them.

``make_sampler`` then applies the user's choices over it: ``greedy=True`` or
a ``temperature`` of 0 picks greedily, a positive ``temperature`` samples,
and ``top_k``, ``top_p`` and ``repetition_penalty`` replace the file's where
given; with neither, the file's ``do_sample`` decides.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import BlockcError
from .sampling import Sampler
from .text import read_json

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
    fields = read_json(file, "the generation config")
    given = {name: fields[name] for name in ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty")
             if fields.get(name) is not None}
    kinds = {"do_sample": (bool,), "top_k": (int,), "temperature": (int, float), "top_p": (int, float),
             "repetition_penalty": (int, float)}
    for name, value in given.items():
        if not isinstance(value, kinds[name]) or (name != "do_sample" and isinstance(value, bool)):
            raise BlockcError(f"{file}: {name} must be a {kinds[name][-1].__name__}, got {value!r}")
    return GenerationDefaults(eos_ids=_eos_ids(fields.get("eos_token_id"), file), **given)


def make_sampler(defaults: GenerationDefaults, *, greedy: bool = False, temperature: float | None = None,
                 top_k: int | None = None, top_p: float | None = None, repetition_penalty: float | None = None,
                 seed: int = 0) -> Sampler:
    """The ``pick`` for ``generate``: the user's choices over the directory's defaults (see the module)."""
    sample = defaults.do_sample if temperature is None else temperature > 0
    sample = sample and not greedy
    if not sample and (top_k is not None or top_p is not None):
        raise BlockcError("--top-k and --top-p filter what is sampled: give --temperature T (> 0) with them")
    penalty = defaults.repetition_penalty if repetition_penalty is None else repetition_penalty
    if not sample:   # HF's do_sample=False: greedy, after the repetition penalty
        return Sampler(0.0, repetition_penalty=penalty, seed=seed)
    return Sampler(defaults.temperature if temperature is None else temperature,
                   defaults.top_k if top_k is None else top_k, defaults.top_p if top_p is None else top_p,
                   penalty, seed=seed)
