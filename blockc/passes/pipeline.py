"""The optimization pipeline, in order: the one place passes are named.

Each entry is one pass in one file. The pipeline is written in named stages,
and the lists other modules need (``FUSIONS``, ``RECOMPOSITIONS``) are read
from them, so adding a pass is one line here.
"""
from __future__ import annotations

from .constant_fold import constant_fold
from .cse import cse
from .dce import dce
from .fuse_add_layernorm import fuse_add_layernorm
from .fuse_attention import fuse_attention
from .fuse_bias_activation import fuse_bias_activation
from .fuse_cache_attention import fuse_cache_attention
from .fuse_masked_softmax import fuse_masked_softmax
from .fuse_qkv import fuse_qkv
from .fuse_qkv_attention import fuse_qkv_attention
from .fuse_repeat_kv import fuse_repeat_kv
from .fuse_rotary import fuse_rotary
from .recompose_gelu import recompose_gelu
from .recompose_norms import recompose_norms
from .recompose_silu import recompose_silu
from .recompose_softmax import recompose_softmax
from .simplify_reshapes import simplify_reshapes

STAGES = {
    "canonicalise": (dce, cse, constant_fold, simplify_reshapes),
    # raise decomposed math (ours, or an exporter's) back to standard ops
    "recompose": (recompose_softmax, recompose_norms, recompose_gelu, recompose_silu),
    "fuse": (fuse_qkv, fuse_rotary, fuse_masked_softmax, fuse_attention, fuse_repeat_kv, fuse_cache_attention,
             fuse_qkv_attention, fuse_add_layernorm, fuse_bias_activation),
    # tidy up what the fusions left
    "tidy": (cse, dce),
}


def default_pipeline() -> list:
    """Every pass, in the order the pass manager runs them (a pass may recur)."""
    return [p for passes in STAGES.values() for p in passes]


# The passes whose sites the fusion report shows, as fusions and as recompositions.
FUSIONS = tuple(p.__name__ for p in STAGES["fuse"])
RECOMPOSITIONS = tuple(p.__name__ for p in STAGES["recompose"])
