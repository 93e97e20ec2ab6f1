"""Where a decoder ONNX file carries its cache: the past inputs and the
present outputs, in pairs, and the dims that tie them.

A file exported with its cache (ONNX Runtime GenAI's model builder, optimum,
blockc's own ``for_cache``) takes each layer's keys and values so far as
inputs ``[batch, kv_heads, past, head_size]`` and returns them with the
step's rows as outputs ``[batch, kv_heads, total, head_size]``. The pairs are
found, in this order:

* given: ``pairs=[("past_key_values.0.key", "present.0.key"), ...]``;
* as ``genai_config.json`` beside the file names them
  (``decoder.inputs.past_key_names``, ``"past_key_values.%d.key"``, and the
  outputs' ``present_key_names``, for ``num_hidden_layers`` layers);
* by name: each input ``past_key_values.N.key`` / ``past.N.key`` (and
  ``value``) with the output ``present.N.key``.

Each pair must agree in every dim but the third, and the file names the
past's and the total's lengths (``past_sequence_length``,
``total_sequence_length``) and the step's (``input_ids``' second dim). A
file states no relation between them; ``CacheIO.dims`` gives the one a
step means, for ``OnnxModel(path, dims=...)``: ``total = past + seq`` (the
present is the past with the step appended), or a past of a fixed number of
rows, a buffer the step writes its rows into (the in-place cache).

A file may also say a length is a sum in its name: Optimum names a cache
step's mask and presents ``past_sequence_length + sequence_length``, blockc's
``for_cache`` the present's ``past+seq``. ``summed_dim`` reads such a name,
the one rule for both (``OnnxModel`` imports such a dim as the sum of its
terms' symbols, beside the step's dims).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Sequence

from ...errors import OnnxFileError
from ...ir.dims import Dim, Sym
from ..json_files import json_field, read_json
from .safe_load import label

_BY_NAME = re.compile(r"^(?:past_key_values|past)\.(\d+)\.(key|value)$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class CacheIO:
    """A decoder file's cache: ``pairs`` (past input, present output), the
    dim_params of the past's, the present's and the step's lengths, and the
    names of its token ids and attention mask inputs."""

    pairs: tuple[tuple[str, str], ...]
    past: str | int
    total: str | int
    seq: str
    input_ids: str
    attention_mask: str | None
    sizes: tuple[tuple[str, int], ...] = ()   # cache dims the file names and its genai_config.json sizes


    def dims(self, cache_len: int | None = None) -> dict[str, Dim]:
        """The dims of one step: the present is the past and the step
        (``total = past + seq``), or, given ``cache_len``, the past is a buffer
        of that many rows and ``total`` the rows written so far."""
        fixed = dict(self.sizes)
        if cache_len is not None and isinstance(self.past, str):
            return {**fixed, self.past: int(cache_len)}
        if isinstance(self.past, str) and isinstance(self.total, str) and self.past != self.total:
            return {**fixed, self.total: Sym.var(self.past) + Sym.var(self.seq)}
        return fixed   # the file's own dims say it already (a buffer of fixed rows)


def _shape(value) -> list:
    t = value.type.tensor_type
    return [d.dim_param if d.HasField("dim_param") and d.dim_param else
            (d.dim_value if d.HasField("dim_value") else None) for d in t.shape.dim]


GENAI_CONFIG = "genai_config.json"


def genai_config_path(path: str | os.PathLike) -> str:
    """Where ONNX Runtime GenAI's config of the decoder file at ``path`` lies: beside it."""
    return os.path.join(os.path.dirname(os.path.abspath(os.fspath(path))), GENAI_CONFIG)


def genai_config(path: str | os.PathLike) -> tuple[str, dict] | None:
    """The ``genai_config.json`` beside the decoder file at ``path``, as its
    path and its object (read by the one JSON reader, ``json_files``), or
    None where there is none."""
    config = genai_config_path(path)
    return (config, read_json(config, "GenAI settings", OnnxFileError)) if os.path.isfile(config) else None


def _genai_pairs(config_path: str, config: dict) -> tuple[list[tuple[str, str]], dict, dict]:
    """The pairs ``genai_config.json`` names, its decoder's input names, and the
    sizes of the cache's heads (``num_key_value_heads``, ``head_size``) by axis."""
    def field(name: str, kind):
        return json_field(config, f"model.decoder.{name}", kind, file=config_path, error=OnnxFileError)
    ins, layers = field("inputs", dict), field("num_hidden_layers", int)
    patterns = {kv: (field(f"inputs.past_{kv}_names", str), field(f"outputs.present_{kv}_names", str))
                for kv in ("key", "value")}
    try:
        pairs = [(patterns[kv][0] % i, patterns[kv][1] % i) for i in range(layers) for kv in ("key", "value")]
    except (TypeError, ValueError) as e:
        raise OnnxFileError(f"{config_path}: model.decoder's past_key_names, present_key_names (and value) are "
                            f"names with one %d for the layer: {e}") from None
    sizes = {1: field("num_key_value_heads", int), 3: field("head_size", int)}
    return pairs, ins, sizes


def _by_name(inputs: dict, outputs: dict) -> list[tuple[str, str]]:
    pairs = []
    for name in inputs:
        m = _BY_NAME.match(name)
        if m and f"present.{m[1]}.{m[2]}" in outputs:
            pairs.append((name, f"present.{m[1]}.{m[2]}"))
    return pairs


def find_cache(path: str | os.PathLike, graph, pairs: Sequence[tuple[str, str]] | None = None) -> CacheIO:
    """The cache of the decoder file at ``path`` whose graph is ``graph`` (see
    the module docstring); an ``OnnxFileError`` naming what does not fit."""
    path = os.fspath(path)
    inputs = {v.name: v for v in graph.input}
    outputs = {v.name: v for v in graph.output}
    names, sizes = {}, {}
    config = genai_config(path) if pairs is None else None
    if config is not None:
        pairs, names, sizes = _genai_pairs(*config)
    elif pairs is None:
        pairs = _by_name(inputs, outputs)
    if not pairs:
        raise OnnxFileError(f"{path}: no cache inputs and outputs found (past_key_values.N.key / present.N.key, "
                            f"or as genai_config.json names them): give the pairs explicitly")
    ids = names.get("input_ids", "input_ids")
    mask = names.get("attention_mask", "attention_mask")
    if ids not in inputs or len(_shape(inputs[ids])) != 2:
        raise OnnxFileError(f"{path}: no [batch, sequence] token ids input {label(ids)}")
    seq = _shape(inputs[ids])[1]
    lengths = {_pair_lengths(path, inputs, outputs, p, q) for p, q in pairs}
    if len(lengths) != 1:
        raise OnnxFileError(f"{path}: the cache inputs name their lengths differently: {sorted(lengths)}")
    (past, total), = lengths
    for dim, what in ((past, "past"), (total, "total"), (seq, "sequence")):
        if what == "total" and _is_sum(total, past, seq):
            continue   # blockc writes the present's length as 'past+seq'
        if not isinstance(dim, int) and not (isinstance(dim, str) and _IDENTIFIER.match(dim)):
            raise OnnxFileError(f"{path}: the cache's {what} length is {dim!r}, neither a size nor a named dim")
    shape = _shape(inputs[pairs[0][0]])
    named = tuple((shape[axis], size) for axis, size in sizes.items() if isinstance(shape[axis], str))
    return CacheIO(tuple(pairs), past, total, seq, ids, mask if mask in inputs else None, named)


def _is_sum(total, past, seq) -> bool:
    """Whether ``total`` is written as the sum of ``past`` and ``seq`` ('past+seq')."""
    return isinstance(total, str) and sorted(summed_dim(total, {past, seq}) or []) == sorted([past, seq])


def summed_dim(text: str, named) -> list[str] | None:
    """The dims a dim_param names the sum of, ``a + b`` (spaces or none), where
    each of its terms is one of the ``named`` dims; else None."""
    parts = [p.strip() for p in text.split("+")]
    return parts if len(parts) > 1 and all(p in named for p in parts) else None


def _pair_lengths(path: str, inputs: dict, outputs: dict, past: str, present: str) -> tuple:
    if past not in inputs or present not in outputs:
        missing = label(past) if past not in inputs else label(present)
        raise OnnxFileError(f"{path}: cache pair {label(past)} -> {label(present)}: the file has no {missing}")
    a, b = _shape(inputs[past]), _shape(outputs[present])
    if len(a) != 4 or len(b) != 4 or a[:2] + a[3:] != b[:2] + b[3:]:
        raise OnnxFileError(f"{path}: cache pair {label(past)} {a} -> {label(present)} {b}: not "
                            f"[batch, kv_heads, length, head_size] alike but for the length")
    return a[2], b[2]


def step_dims(path: str | os.PathLike, graph) -> dict[str, Dim]:
    """The dims of a cached step (``total = past + seq``) where the file at
    ``path`` carries a cache found by name or by its ``genai_config.json``;
    none where it carries none (an error where that config does not fit)."""
    if os.path.isfile(genai_config_path(path)):
        return find_cache(path, graph).dims()
    try:   # found by name alone: a file whose names only look so is imported as its dims say
        return find_cache(path, graph).dims()
    except OnnxFileError:
        return {}
