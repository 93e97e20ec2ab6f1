"""What the Hugging Face loaders share: reading a config, converting tensors,
and mapping a ``state_dict`` onto a DSL model with every problem listed at once.

A loader describes its checkpoint as a table ``{hf_name: Source}``; each
``Source`` names the DSL parameters the tensor becomes and whether it is a
torch ``nn.Linear`` weight (``[out, in]``, transposed into blockc's
``[in, out]``). ``map_state_dict`` does the rest the same way for every
family: names with or without the base model's prefix (``model.``,
``transformer.``), ignored buffers, a head tied to the token table, fixed
tables the DSL makes itself, and one ``WeightsError`` listing every missing,
unexpected or misshapen tensor. Nothing here imports torch or transformers:
tensors are converted by duck typing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np

from ..errors import WeightsError
from ..ir.dtypes import DType
from ..ops.activations import ACTIVATIONS
from .module import Model
from .weights import check_weights


# A Hugging Face activation name (``hidden_act``, GPT-2's ``activation_function``)
# -> the blockc activation that computes the same function (``Activation.hf_names``).
HF_ACTIVATIONS = {hf: act.name for act in ACTIVATIONS.values() for hf in act.hf_names}


def hf_setting(cfg: Any, key: str, default=None):
    """``cfg.key`` of a ``transformers`` config, or ``cfg[key]`` of its ``config.json`` as a dict."""
    if isinstance(cfg, Mapping):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


def to_numpy(t: Any) -> np.ndarray:
    """A torch tensor (any device, any dtype, bfloat16 too) or array as numpy."""
    if hasattr(t, "detach") and hasattr(t, "cpu"):
        t = t.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":  # torch cannot hand bfloat16 to numpy
            return t.float().numpy().astype(DType.bfloat16.numpy)
        return t.numpy()
    return np.asarray(t)


@dataclass(frozen=True)
class Source:
    """What one checkpoint tensor becomes: the DSL parameters ``dsl`` (several:
    split along the last axis, in that order), after a transpose when it is
    an ``nn.Linear`` weight stored ``[out, in]``."""

    dsl: tuple[str, ...]
    transpose: bool = False


def map_state_dict(state_dict: Mapping[str, Any], model: Model, sources: Mapping[str, Source], *, family: str,
                   prefix: str = "", ignored: Iterable[str] = (),
                   tied: tuple[str, str] | None = None) -> dict[str, np.ndarray]:
    """Weights for ``model`` from a ``state_dict`` described by ``sources``.

    A key may carry ``prefix`` or not (a bare base model's state dict).
    ``ignored`` names are buffers, not weights (mask buffers, RoPE's
    ``inv_freq``). ``tied=(head, table)``: the model has no head of its own,
    so a ``head`` tensor present must equal ``table``. Parameters no source
    fills whose initialiser is a formula (RoPE's cos/sin tables, the
    sinusoidal table) are made from it. Values are cast to the model's dtype;
    every problem is listed in one ``WeightsError`` (its ``problems`` holds them).
    """
    ignored, head = set(ignored), tied[0] if tied else None
    expected = dict(model.named_parameters())
    problems: list[str] = []
    found: dict[str, Any] = {}
    for key, value in state_dict.items():
        name = key if key in sources or key in ignored or key == head else prefix + key
        if name in sources or name == head:
            found[name] = value
        elif name not in ignored:
            problems.append(f"unexpected: {key}")
    out: dict[str, np.ndarray] = {}
    for hf_name, source in sources.items():
        if hf_name not in found:
            problems.append(f"missing: {hf_name}")
            continue
        array = to_numpy(found[hf_name])
        widths = [expected[n].shape[-1] for n in source.dsl]
        want = expected[source.dsl[0]].shape[:-1] + (sum(widths),)
        stored = want[::-1] if source.transpose else want  # the message speaks of the checkpoint's layout
        if tuple(array.shape) != stored:
            problems.append(f"shape: {hf_name} is {list(array.shape)}, expected {list(stored)}")
            continue
        if source.transpose:
            array = array.T
        parts = np.split(array, np.cumsum(widths)[:-1], axis=-1) if len(source.dsl) > 1 else [array]
        for n, part in zip(source.dsl, parts):
            out[n] = np.ascontiguousarray(part).astype(model.dtype.numpy)
    if tied and head in found and tied[1] in found:
        head_value, table = to_numpy(found[head]), to_numpy(found[tied[1]])
        if head_value.shape != table.shape or not np.array_equal(head_value, table):
            problems.append(f"untied: {head} differs from {tied[1]}; the model's head is the token table")
    filled = {n for s in sources.values() for n in s.dsl}
    for name, p in expected.items():
        if name not in filled and callable(p.init):
            out[name] = p.make(name, 0, model.dtype)
    if problems:
        err = WeightsError(f"{family} state dict does not fit {model.name!r} ({len(problems)} problem"
                           f"{'s' if len(problems) != 1 else ''}):\n  " + "\n  ".join(problems))
        err.problems = problems
        raise err
    return dict(check_weights(model, out))
