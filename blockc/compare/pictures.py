"""The graphs the report draws: one block of the model, before and after
the optimization pipeline.

A built-in model with a ``layers`` setting is rebuilt with one layer (its
embeddings and head stay, so the picture shows where they fuse too); any
other model is drawn whole.
"""
from __future__ import annotations

from ..frontends.catalog import BUILTINS, build_model, config_fields, parse_sets
from ..ir.graph import Graph


def block_graphs(options) -> tuple[Graph, Graph]:
    """(standard, fused) graphs of one block of ``options.model``."""
    from ..frontends import trace
    from ..passes.manager import optimize
    sets = parse_sets(options.settings)
    if options.dtype:
        sets["dtype"] = options.dtype
    if options.model in BUILTINS and "layers" in config_fields(BUILTINS[options.model].config):
        sets["layers"] = "1"
    graph = trace(build_model(options.model, sets))
    return graph, optimize(graph).graph
