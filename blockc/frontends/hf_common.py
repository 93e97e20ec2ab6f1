"""What the Hugging Face loaders share: reading a config, converting tensors,
and mapping a ``state_dict`` onto a DSL model with every problem listed at once.

A loader describes its checkpoint as a ``Layout``: a table ``{hf_name: Source}``; each
``Source`` names the DSL parameters the tensor becomes and whether it is a
torch ``nn.Linear`` weight (``[out, in]``, transposed into blockc's
``[in, out]``), and its prefixes, buffers and tied head. ``map_state_dict`` does the rest the same way for every
family: names with or without the base model's prefix (``model.``,
``transformer.``), ignored buffers, a head tied to the token table, fixed
tables the DSL makes itself, and one ``WeightsError`` listing every missing,
unexpected or misshapen tensor. Nothing here imports torch or transformers:
tensors are converted by duck typing. ``plan_checkpoint`` does the checking
from the tensors' shapes alone, so a checkpoint on disk (``hf_dir``) is
checked before any tensor is read, and read one tensor at a time.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from ..errors import ModelError, WeightsError
from ..ir.dtypes import DType
from ..ops.activations import ACTIVATIONS
from .module import Model
from .weights import check_weights, contiguous


# A Hugging Face activation name (``hidden_act``, GPT-2's ``activation_function``)
# -> the blockc activation that computes the same function (``Activation.hf_names``).
HF_ACTIVATIONS = {hf: act.name for act in ACTIVATIONS.values() for hf in act.hf_names}


def hf_setting(cfg: Any, key: str, default=None):
    """``cfg.key`` of a ``transformers`` config, or ``cfg[key]`` of its ``config.json`` as a dict."""
    if isinstance(cfg, Mapping):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


def hf_model_type(cfg: Any, title: str, supported) -> str:
    """``cfg``'s ``model_type`` (where it names none, the first ``supported``),
    refused in one line when a loader for ``title`` does not take it."""
    model_type = hf_setting(cfg, "model_type", next(iter(supported)))
    if model_type not in supported:
        raise ModelError(f"not a {title} config: model_type is {model_type!r} (supported: {', '.join(supported)})")
    return model_type


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


# Names older checkpoints use (bert-base-uncased's files among them), which
# transformers renames on load for every model ("legacy" in its conversion mapping).
LEGACY_NAMES = (("LayerNorm.gamma", "LayerNorm.weight"), ("LayerNorm.beta", "LayerNorm.bias"))


def modern_name(key: str) -> str:
    """``key`` with a legacy ending renamed as transformers renames it on load."""
    for old, new in LEGACY_NAMES:
        if key.endswith(old):
            return key[:-len(old)] + new
    return key


@dataclass(frozen=True)
class Layout:
    """A family's checkpoint layout for one model: ``sources`` (see ``Source``);
    keys may carry ``prefix`` or not (a bare base model's); ``base``: where a
    task model keeps its base model (``bert.``): when a key has it, only those
    keys are read, without it; ``ignored`` names are buffers, not weights (mask
    buffers, RoPE's ``inv_freq``); ``tied=(head, table)``: the model has no
    head of its own, so a ``head`` tensor present must equal ``table``."""

    family: str
    sources: Mapping[str, Source]
    prefix: str = ""
    base: str = ""
    ignored: frozenset = frozenset()
    tied: tuple[str, str] | None = None


@dataclass(frozen=True)
class Take:
    """One DSL parameter cut from a checkpoint tensor: ``key`` as the
    checkpoint names it, transposed or not, then columns ``[start, stop)``
    of its last axis."""

    key: str
    transpose: bool
    start: int
    stop: int

    def copies(self, stored: np.dtype, dtype: DType) -> bool:
        """Whether the parameter, read from a stored tensor of dtype ``stored``,
        is a new array (a cast) rather than ``view``'s view of the stored one."""
        return np.dtype(stored) != dtype.numpy

    def view(self, tensor: Any) -> np.ndarray:
        """The stored tensor as the parameter reads it, in its stored dtype and
        without a copy: transposed, then cut to its columns (out of C order
        where either applies). A runtime that wants it in order makes that
        copy once, into its cache, beside the merges it folds over such views
        (``runtime/folded_params.py``): so a checkpoint's q/k/v bytes are
        written once, merged, not also as transposed copies that no session reads."""
        array = to_numpy(tensor)
        if self.transpose:
            array = array.T
        if array.ndim and (self.start, self.stop) != (0, array.shape[-1]):
            array = array[..., self.start:self.stop]
        return array

    def apply(self, tensor: Any, dtype: DType) -> np.ndarray:
        """The parameter as a new array in C order and ``dtype`` (a cast, or a state dict's tensor in memory)."""
        return contiguous(self.view(tensor)).astype(dtype.numpy, copy=False)


def plan_checkpoint(shapes: Mapping[str, tuple], model: Model, layout: Layout, read: Callable[[str], Any],
                    files: Mapping[str, str] | None = None) -> dict[str, Take]:
    """How each of ``model``'s parameters is read from a checkpoint whose
    tensors have ``shapes`` (by key), found from the shapes alone; ``read(key)``
    is called only for a tied head and its table, which must be equal.
    Parameters no source fills (made tables) are left out. Every missing,
    unexpected or misshapen tensor is listed in one ``WeightsError`` (its
    ``problems`` holds them), named as the checkpoint names them, with the
    file holding it where ``files`` (key -> file) says."""
    sources, ignored, head = layout.sources, set(layout.ignored), layout.tied[0] if layout.tied else None
    keys = list(shapes)
    if layout.base and any(k.startswith(layout.base) for k in keys):
        keys = [k for k in keys if k.startswith(layout.base)]   # a task model: its head is left out
    expected = dict(model.named_parameters())
    problems: list[str] = []
    found: dict[str, str] = {}   # source name -> the checkpoint's key
    for key in keys:
        bare = modern_name(key[len(layout.base):] if layout.base and key.startswith(layout.base) else key)
        name = bare if bare in sources or bare in ignored or bare == head else layout.prefix + bare
        if name in sources or name == head:
            found[name] = key
        elif name not in ignored:
            problems.append(f"unexpected: {key}")
    plan: dict[str, Take] = {}
    for hf_name, source in sources.items():
        if hf_name not in found:
            problems.append(f"missing: {hf_name}")
            continue
        key = found[hf_name]
        widths = [expected[n].shape[-1] for n in source.dsl]
        want = expected[source.dsl[0]].shape[:-1] + (sum(widths),)
        stored = want[::-1] if source.transpose else want  # the message speaks of the checkpoint's layout
        if tuple(shapes[key]) != stored:
            where = f" (in {files[key]})" if files and key in files else ""
            problems.append(f"shape: {key} is {list(shapes[key])}, expected {list(stored)}{where}")
            continue
        ends = np.cumsum([0] + widths)
        plan.update({n: Take(key, source.transpose, int(ends[i]), int(ends[i + 1]))
                     for i, n in enumerate(source.dsl)})
    if layout.tied and head in found and layout.tied[1] in found:
        head_value, table = to_numpy(read(found[head])), to_numpy(read(found[layout.tied[1]]))
        if head_value.shape != table.shape or not np.array_equal(head_value, table):
            problems.append(f"untied: {head} differs from {layout.tied[1]}; the model's head is the token table")
    if problems:
        err = WeightsError(f"{layout.family} state dict does not fit {model.name!r} ({len(problems)} problem"
                           f"{'s' if len(problems) != 1 else ''}):\n  " + "\n  ".join(problems))
        err.problems = problems
        raise err
    return plan


def map_state_dict(state_dict: Mapping[str, Any], model: Model, layout: Layout) -> dict[str, np.ndarray]:
    """Weights for ``model`` from a ``state_dict`` laid out as ``layout``
    (``plan_checkpoint``). Parameters no source fills whose initialiser is a
    formula (RoPE's cos/sin tables, the sinusoidal table) are made from it.
    Values are cast to the model's dtype."""
    shapes = {k: tuple(getattr(v, "shape", np.shape(v))) for k, v in state_dict.items()}
    plan = plan_checkpoint(shapes, model, layout, lambda key: state_dict[key])
    out = {name: take.apply(state_dict[take.key], model.dtype) for name, take in plan.items()}
    for name, p in model.named_parameters():
        if name not in plan and callable(p.init):
            out[name] = p.make(name, 0, model.dtype)
    return dict(check_weights(model, out))
