"""A Hugging Face checkpoint directory as a blockc model: ``blockc run path/to/dir``.

A directory as ``save_pretrained`` writes it -- ``config.json`` and
``model.safetensors``, or shards listed by ``model.safetensors.index.json``
-- becomes the ``DecoderLM`` or ``Encoder`` its ``model_type`` names, built by
the family's ``*_config_from_hf`` from ``config.json`` read as a dict (no
torch, no transformers). Each parameter's initialiser reads its tensor from
the checkpoint, as an ONNX file's initializers are read (``onnx/model.py``),
so ``init_weights`` -- and every command -- gets the checkpoint's weights,
and ``--weights`` still replaces them.

Nothing is read whole: the shards' headers (names, shapes, dtypes) are read
when the model is built, and every missing, unexpected or misshapen tensor
is refused then (``hf_common.plan_checkpoint``). A weight is a view of the
checkpoint's memory-mapped file (``weights.SafetensorsFiles``), out of
order where it is a transposed ``nn.Linear`` weight or GPT-2's q/k/v
columns (ONNX Runtime's sessions put it in order once, into the cache:
``runtime/folded_params.py``); only a cast is a copy, made once into a
prepared file of the cache and a view of it on later runs (``Checkpoint``,
``prepared.py``). The model keeps the checkpoint's float dtype (float16,
bfloat16) unless ``--set dtype=...`` casts it.

``pytorch_model.bin`` is a pickle, and unpickling runs whatever code the
file names: a directory with only that is refused, with how to convert it.
"""
from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import BlockcError, ModelError, WeightsError
from ..ir.dtypes import DType
from .hf_bert import FAMILIES as BERT_FAMILIES, bert_config_from_hf, bert_layout
from .hf_common import Layout, Take, plan_checkpoint
from .hf_gpt2 import gpt2_config_from_hf, gpt2_layout
from .hf_llama import FAMILIES as LLAMA_FAMILIES, llama_config_from_hf, llama_layout
from .json_files import json_field, read_json
from .models import DecoderLM, Encoder
from .module import Model
from .prepared import prepared_arrays
from .settings import convert_setting
from .weights import SafetensorsFiles

CONFIG = "config.json"
SAFETENSORS = "model.safetensors"
INDEX = "model.safetensors.index.json"
PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json")

# safetensors' dtype codes of the float dtypes a model may have
_FLOATS = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64"}
# what --set may change on a directory's model, and each value's kind
SETTINGS = {"dtype": str, "probs": bool, "pooler": bool}


@dataclass(frozen=True)
class Family:
    """What a ``model_type`` becomes: its config mapping, model class, checkpoint
    layout, and the settings (``--set``) its config mapping takes."""

    config: Callable
    model: type
    layout: Callable[[Model, str], Layout]
    settings: tuple[str, ...]


# model_type -> its family (what each maps is the loaders' docstrings, and the README's table)
_GPT2 = Family(gpt2_config_from_hf, DecoderLM, lambda model, model_type: gpt2_layout(model), ("dtype", "probs"))
_BERT = Family(bert_config_from_hf, Encoder, bert_layout, ("dtype", "pooler"))
_LLAMA = Family(llama_config_from_hf, DecoderLM, lambda model, model_type: llama_layout(model), ("dtype", "probs"))
FAMILIES = {"gpt2": _GPT2, **{t: _BERT for t in BERT_FAMILIES}, **{t: _LLAMA for t in LLAMA_FAMILIES}}


def is_hf_dir(spec: str) -> bool:
    return os.path.isdir(spec)


def load_hf_dir(path: str, overrides: dict[str, str] | None = None) -> Model:
    """The model of the Hugging Face checkpoint directory ``path``, its weights
    read from the checkpoint (see the module docstring). ``overrides`` are
    ``--set`` texts: ``dtype``, and ``probs`` (decoders) or ``pooler`` (encoders)."""
    config = read_config(path)
    model_type = config.get("model_type")
    family = FAMILIES.get(model_type)
    if family is None:
        raise ModelError(f"{os.path.join(path, CONFIG)}: model_type {model_type!r} is not supported; "
                         f"supported: {', '.join(FAMILIES)}")
    files = SafetensorsFiles(weight_files(path))
    settings = _settings(path, family, overrides or {})
    settings.setdefault("dtype", checkpoint_dtype(files))
    try:
        model = family.model(family.config(config, **settings), name=os.path.basename(os.path.normpath(path)))
    except ModelError as e:
        raise ModelError(f"{os.path.join(path, CONFIG)}: {e}") from None
    except (TypeError, ValueError) as e:   # a field of the wrong kind: "hidden_size": "big"
        raise ModelError(f"{os.path.join(path, CONFIG)}: a setting has a value of the wrong kind: {e}") from None
    try:
        plan = plan_checkpoint(files.shapes, model, family.layout(model, model_type), files.__getitem__,
                               files=files.files)
    except WeightsError as e:
        err = WeightsError(f"{path}: {e}")
        err.problems = getattr(e, "problems", [])
        raise err from None
    checkpoint = Checkpoint(files, {name: (take, p.dtype or model.dtype, tuple(p.shape))
                                    for name, p in model.named_parameters() if (take := plan.get(name))})
    for name, p in model.named_parameters():
        if name in plan:
            p.init = checkpoint.reader(name)
    return model


class Checkpoint:
    """The parameters a checkpoint's tensors become (``takes``: name -> its
    ``Take``, dtype and shape). A take of the stored dtype is a view of the
    checkpoint's file (``Take.view``), transposed or cut to columns or not:
    no load copies it, and the sessions that need it in order make that
    copy once, beside the merges they fold over such views, so no byte is
    written twice (``runtime/folded_params.py``). The casts are made
    together, on the first read of any of them, into one prepared file of
    the cache (``prepared.prepared_arrays``), keyed by the checkpoint's
    files' ``source_identity``, those takes and the code's version, so they
    are views of a file too and later runs make none. A checkpoint written
    just now (racy) has them made in memory, each on its own read."""

    def __init__(self, files: SafetensorsFiles, takes: dict[str, tuple[Take, DType, tuple[int, ...]]]):
        self.files, self.takes = files, takes
        # an ordered set (the recipe follows its order; every read asks membership)
        self.copying = dict.fromkeys(name for name, (take, dtype, _) in takes.items()
                                     if take.copies(files.dtype_of(take.key), dtype))
        self._prepared: dict[str, np.ndarray] | None = None

    def reader(self, name: str):
        """The parameter's initialiser (``Parameter.make`` calls it as ``init(shape, rng)``)."""
        return lambda shape, rng: self.read(name)

    def read(self, name: str) -> np.ndarray:
        if name in self.copying:
            if self._prepared is None:
                self._prepared = self._prepare()
            if name in self._prepared:
                return self._prepared[name]
            return self.make(name)
        take = self.takes[name][0]
        return take.view(self.files[take.key])

    def make(self, name: str) -> np.ndarray:
        take, dtype, _ = self.takes[name]
        return take.apply(self.files[take.key], dtype)

    def _prepare(self) -> dict[str, np.ndarray]:
        """The copying takes as views of their prepared file; none (each made on
        its own read) when the checkpoint is racy (``prepared_arrays`` None)."""
        recipe, specs = [], {}
        for name in self.copying:
            take, dtype, shape = self.takes[name]
            recipe.append([name, take.key, take.transpose, take.start, take.stop, dtype.name])
            specs[name] = (dtype.numpy, shape)
        return prepared_arrays(json.dumps(recipe), specs, self.make, self.files.stats) or {}


def read_config(path: str) -> dict:
    """``config.json`` of the directory ``path`` as a dict, or a ``ModelError``
    saying what is wrong with it."""
    file = os.path.join(path, CONFIG)
    if not os.path.isfile(file):
        raise ModelError(f"{path} is a directory without {CONFIG}: a Hugging Face checkpoint directory holds "
                         f"{CONFIG} and {SAFETENSORS} (or shards and {INDEX})")
    return read_json(file, "settings")


def weight_files(path: str) -> list[str]:
    """The ``.safetensors`` files of the checkpoint in ``path``: its shards (in
    the index's order) or ``model.safetensors``."""
    index = os.path.join(path, INDEX)
    if os.path.isfile(index):
        weight_map = json_field(read_json(index, "tensors and their shards", WeightsError), "weight_map", dict,
                                file=index, error=WeightsError)
        shards = list(dict.fromkeys(weight_map.values()))
        if not shards or not all(isinstance(s, str) for s in shards):
            raise WeightsError(f"{index}: weight_map names no shard files")
        missing = [s for s in shards if not os.path.isfile(os.path.join(path, s))]
        if missing:
            raise WeightsError(f"{index} lists {', '.join(missing)}, not in {path}")
        return [os.path.join(path, s) for s in shards]
    if os.path.isfile(os.path.join(path, SAFETENSORS)):
        return [os.path.join(path, SAFETENSORS)]
    pickles = [p for p in PICKLES if os.path.isfile(os.path.join(path, p))]
    if pickles:
        raise WeightsError(f"{path} holds {pickles[0]}, a pickle: blockc does not unpickle (loading a pickle "
                           f"can run any code it names). Convert it to safetensors with transformers: "
                           f"AutoModel.from_pretrained(DIR).save_pretrained(DIR, safe_serialization=True)")
    raise WeightsError(f"{path} has no weights: neither {SAFETENSORS} nor {INDEX}")


def checkpoint_dtype(files: SafetensorsFiles) -> str:
    """The float dtype most of the checkpoint's tensors have (float32 if none)."""
    counts = Counter(_FLOATS[d] for d in files.dtypes.values() if d in _FLOATS)
    return counts.most_common(1)[0][0] if counts else "float32"


def _settings(path: str, family: Family, overrides: dict[str, str]) -> dict:
    unknown = [k for k in overrides if k not in family.settings]
    if unknown:
        raise BlockcError(f"{path}: --set {', '.join(repr(k) for k in unknown)} does not apply: a Hugging Face "
                          f"directory's sizes come from its {CONFIG}; settings: {', '.join(family.settings)}")
    return {k: convert_setting(path, k, SETTINGS[k], v) for k, v in overrides.items()}
