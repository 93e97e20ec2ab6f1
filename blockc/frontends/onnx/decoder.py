"""A decoder ONNX file that carries its cache, as ``generate`` drives it.

The file is one step: token ids, an attention mask and every layer's past
in; logits and every layer's present out (``cache_io``). Its step graphs
are the file's own, imported with the dims a step means:

* ``step()``: the present is the past with the step appended
  (``total = past + seq``); with a past of 0 rows it is the prefill;
* ``step(cache_len)``: the past is a buffer of ``cache_len`` rows, which the
  step writes its rows into (the in-place cache, where the file's attention
  allows it: ONNX Runtime GenAI's GroupQueryAttention does).

``cfg`` holds what the generation loop checks a request against, as a
``DecoderLM``'s does: the vocabulary (the logits' last dim), the most
positions (``genai_config.json``'s ``context_length``, else the mask's
bound the graph's limits enforce at run time) and the layers.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ...errors import BlockcError, OnnxFileError
from ..module import trace
from ..json_files import json_field
from .cache_io import CacheIO, find_cache, genai_config
from .model import OnnxModel
from .safe_load import label

UNBOUNDED = 2 ** 31 - 1   # no limit the file states: the graph's own limits are checked at run time


@dataclass(frozen=True)
class FileConfig:
    vocab: int
    max_positions: int
    layers: int


class OnnxDecoder:
    """See the module docstring. ``pairs``: the (past input, present output)
    pairs, where neither ``genai_config.json`` nor the names give them."""

    def __init__(self, path: str | os.PathLike, pairs: Sequence[tuple[str, str]] | None = None):
        self.path = os.fspath(path)
        self.model = OnnxModel(self.path, dims=None if pairs is None else {})
        graph = self.model.file.model.graph
        self.cache: CacheIO = find_cache(self.path, graph, pairs)
        if pairs is not None:
            self.model = OnnxModel(self.path, dims=self.cache.dims())
        self.name = self.model.name
        logits = {o.name: o for o in graph.output}.get("logits")
        vocab = logits.type.tensor_type.shape.dim[-1].dim_value if logits is not None else 0
        if not vocab:
            raise OnnxFileError(f"{self.path}: no output {label('logits')} [batch, sequence, vocabulary] of a "
                                f"known vocabulary size")
        self.cfg = FileConfig(int(vocab), _context_length(self.path), len(self.cache.pairs) // 2)
        specs = {s.name: s for s in self.model.inputs()}
        self.position_ids = "position_ids" if "position_ids" in specs else None
        self.one_length = specs[self.cache.attention_mask].kind == "ones" if self.cache.attention_mask else False
        shape = specs[self.cache.pairs[0][0]].shape
        self.kv_shape = (shape[1], shape[3])

    def inputs(self):
        return self.model.inputs()

    def init_weights(self):
        from ..module import init_weights
        from ..weights import materialize
        return materialize(init_weights(self.model))

    def step(self, cache_len: int | None = None):
        """The step's traced graph: the past appended to, or a buffer of
        ``cache_len`` rows, where the file's attention writes its rows into
        the past (else a ``BlockcError``: a file that appends to its past,
        as blockc's own concat step and most exporters' do, has no in-place step)."""
        return self.traced(self.step_model(cache_len), cache_len)

    def step_model(self, cache_len: int | None = None) -> OnnxModel:
        """The model ``step(cache_len)`` traces (its ``trace_key`` says what it is without tracing)."""
        if cache_len is None:
            return self.model
        try:
            return OnnxModel(self.path, dims=self.cache.dims(cache_len))
        except OnnxFileError:   # the file's own shapes disagree with a buffer past
            raise BlockcError(self._in_place_refusal(cache_len)) from None

    def traced(self, model: OnnxModel, cache_len: int | None = None):
        """``model`` (``step_model(cache_len)``) traced, and its presents checked to be ``cache_len`` rows."""
        if cache_len is None:
            return trace(model)
        try:
            graph = trace(model)
        except OnnxFileError:
            raise BlockcError(self._in_place_refusal(cache_len)) from None
        rows = {str(v.shape[2]) for name, v in graph.outputs if name in {q for _, q in self.cache.pairs}}
        if rows != {str(cache_len)}:
            raise BlockcError(self._in_place_refusal(cache_len))
        return graph

    def _in_place_refusal(self, cache_len: int) -> str:
        return (f"{self.path}: its cache cannot be written in place (each present is its past with the step "
                f"appended, not a buffer of {cache_len} rows): generate with the concat cache (cache='concat', "
                f"--cache concat)")

    def empty_past(self, batch: int, dtype) -> dict[str, np.ndarray]:
        """Each past of 0 rows: what the prefill reads."""
        kv, size = self.kv_shape
        return {past: np.zeros((batch, kv, 0, size), dtype) for past, _ in self.cache.pairs}


def _context_length(path: str) -> int:
    """The longest sequence ``genai_config.json`` gives the file (``model.context_length``), else ``UNBOUNDED``."""
    config = genai_config(path)
    if config is None:
        return UNBOUNDED
    file, fields = config
    return json_field(fields, "model.context_length", int, file=file, error=OnnxFileError, default=UNBOUNDED)
