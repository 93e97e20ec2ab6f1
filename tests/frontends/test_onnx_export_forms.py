"""Every form in which users export a Hugging Face model imports, fuses as the
plain export does, and matches ONNX Runtime on the file.

A form is the set of inputs the export was called with: ``input_ids``
alone (Hugging Face's masking code then finds packed sequences from the
positions it makes, with a ``CumSum``), with ``attention_mask``, with
``position_ids`` alone (the packed-sequence search then runs on the given
positions: the mask is causal within each run of consecutive positions), and
a cache step (``use_cache=True``: ``past_key_values`` in, ``present`` out,
the mask over past and new keys). Each is exported by torch.onnx's dynamo
and TorchScript exporters at a few opsets from 17 to 24, for GPT-2, Llama,
Qwen3 (per-head q/k norms) and BERT (an encoder: no cache), all from
``hf_dirs``' configs at one layer (a norm before and after each sublayer
and a final one already tell every norm's fusion apart; each export is
seconds of torch.onnx, so the smallest model keeps the suite fast).

Each exported file is made once per session (``export_form``), and the
tests of one file run in one pytest-xdist worker (tests/conftest.py).
"""
import functools
import warnings

import pytest

from blockc import optimize
from blockc.frontends import trace
from blockc.frontends.onnx import OnnxModel

from test_onnx_import import check_against_ort

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxscript")   # the dynamo exporter writes its ONNX with it

from hf_dirs import hf_config, hf_model, train_tokenizer  # noqa: E402
from hf_testing import randomise  # noqa: E402

L = 1   # layers: hf_config's other sizes are tiny already
FORMS = {
    "ids": ["input_ids"],
    "mask": ["input_ids", "attention_mask"],
    "pos": ["input_ids", "position_ids"],
    "cache": ["input_ids", "attention_mask", "position_ids"]
    + [f"past_key_values.{i}.{kv}" for i in range(L) for kv in ("key", "value")],
}
# Each form of each family at least once, the opsets spread over the cases.
# The mask form is also test_onnx_import's EXPORTS (GPT-2, BERT and Llama,
# TorchScript at 17, dynamo at 18 and its default): here it is only Llama at
# opset 23, where the dynamo exporter writes RMSNormalization and
# RotaryEmbedding. Qwen3 differs from Llama only by its q/k norms.
# TorchScript cannot write the decoders without an attention mask: HF's
# packed-sequence search calls aten::diff, which it has no conversion for
# (the exporter's own refusal, before any file).
CASES = [("gpt2", "dynamo", "ids", 18), ("gpt2", "dynamo", "pos", 23), ("gpt2", "dynamo", "cache", 24),
         ("gpt2", "torchscript", "cache", 20),
         ("llama", "dynamo", "ids", 20), ("llama", "dynamo", "mask", 23), ("llama", "dynamo", "pos", 24),
         ("llama", "dynamo", "cache", 18), ("llama", "torchscript", "cache", 17),
         ("qwen3", "dynamo", "ids", 23), ("qwen3", "dynamo", "cache", 20),
         ("bert", "dynamo", "ids", 24), ("bert", "dynamo", "pos", 20), ("bert", "torchscript", "ids", 17)]

# The ops of the plain export once optimized (tests/frontends/test_onnx_import.py's
# FUSED): 2L+1 norms (the first of a Llama without a residual before it), L
# attentions (Llama's grouped), 2L rotations, L SwiGLU gates; Qwen3 normalises
# each head's q and k too. Counted in the graph, not as fusion sites: at
# opset 23 the dynamo exporter writes RMSNormalization and RotaryEmbedding,
# imported as the norm and a rotation to fuse.
_GPT = {"add_layernorm": 2 * L + 1, "attention": L}   # BERT's attention then takes its projections in
_LLAMA = {"rmsnorm": 1, "add_rmsnorm": 2 * L, "attention": L, "rotary": 2 * L, "silu": L}
FUSED = {"gpt2": _GPT, "bert": _GPT, "llama": _LLAMA, "qwen3": {**_LLAMA, "rmsnorm": 1 + 2 * L}}

BATCH, SEQ, PAST = 2, 5, 3


@pytest.fixture(scope="session")
def tokenizer():
    return train_tokenizer()


def _model(family, tokenizer):
    layers = {"n_layer": L} if family == "gpt2" else {"num_hidden_layers": L}
    cfg = hf_config(family, len(tokenizer), tokenizer, **layers)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return randomise(hf_model(family, cfg), torch)


def _wrapped(hf, family, names):
    """The model called with ``names`` as keyword arguments, the cache as a
    ``DynamicCache`` of the flat past inputs, returning the first output and
    the flat presents: the signature both exporters trace."""
    cache = "past_key_values.0.key" in names

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = hf

        # named parameters, not *args: the dynamo exporter matches dynamic axes to them
        def forward(self, x0, x1=None, x2=None, x3=None, x4=None, x5=None, x6=None):
            kw = dict(zip(names, (x0, x1, x2, x3, x4, x5, x6)))
            if family == "bert":
                return self.m(**kw, return_dict=False)[0]
            past = [kw.pop(f"past_key_values.{i}.{kv}") for i in range(L) for kv in ("key", "value")] \
                if cache else None
            if cache:
                kw["past_key_values"] = transformers.DynamicCache(
                    [(past[2 * i], past[2 * i + 1]) for i in range(L)], config=hf.config)
            out = self.m(**kw, use_cache=cache, return_dict=True)
            if not cache:
                return out.logits
            return (out.logits, *[t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)])
    return Wrapped().eval()


def _example(name, hf):
    total = PAST + SEQ
    if name == "input_ids":
        return torch.randint(0, 50, (BATCH, SEQ))
    if name == "attention_mask":
        return torch.ones(BATCH, total if "cache" in _example.form else SEQ, dtype=torch.long)
    if name == "position_ids":
        start = PAST if "cache" in _example.form else 0
        return torch.arange(start, start + SEQ).repeat(BATCH, 1)
    cfg = hf.config
    heads = getattr(cfg, "num_key_value_heads", cfg.num_attention_heads)
    size = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return torch.randn(BATCH, heads, PAST, size)


def _axes(name):
    if name.startswith("past_key_values"):
        return {0: "batch", 2: "past"}
    if name == "attention_mask" and _example.form == "cache":
        return {0: "batch", 1: "total"}
    return {0: "batch", 1: "sequence"}


def export(family, exporter, form, opset, tokenizer, path):
    hf = _model(family, tokenizer)
    names = list(FORMS[form])
    if family == "bert" and form == "pos":
        names = ["input_ids", "position_ids"]
    _example.form = form
    args = tuple(_example(n, hf) for n in names)
    outputs = ["logits" if family != "bert" else "last_hidden_state"]
    if form == "cache":
        outputs += [f"present.{i}.{kv}" for i in range(L) for kv in ("key", "value")]
    axes = {n: _axes(n) for n in names}
    axes.update({o: {0: "batch", 2: "total"} for o in outputs[1:]})
    options = dict(dynamo=False) if exporter == "torchscript" else dict(dynamo=True, verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_wrapped(hf, family, names), args, str(path), input_names=names, output_names=outputs,
                          dynamic_axes=axes, opset_version=opset, **options)
    return path


@pytest.fixture(scope="session")
def export_form(tokenizer, tmp_path_factory):
    """``export_form(family, exporter, form, opset)``: the exported file, made
    once per session whichever test module asks for it."""
    @functools.cache
    def get(family, exporter, form, opset):
        return export(family, exporter, form, opset, tokenizer, tmp_path_factory.mktemp("forms") / f"{family}.onnx")
    return get


@pytest.fixture(scope="module", params=CASES, ids=lambda c: "-".join(map(str, c)))
def exported(request, export_form):
    return request.param, export_form(*request.param)


@pytest.mark.parametrize("run", ["reference", "fused-ort"])
def test_form_matches_ort(exported, run):
    """The import on the float64 reference, and optimized and re-exported for
    ONNX Runtime, against ONNX Runtime on the file, at two sequence lengths."""
    (family, exporter, form, opset), path = exported
    # ONNX Runtime's RotaryEmbedding refuses the dynamo exporter's cos/sin caches
    # of one row for a batch of two (its rows are computed without position_ids)
    batch = 1 if exporter == "dynamo" and opset >= 23 and family in ("llama", "qwen3") else 2

    def dims(seq):
        return {"batch": batch, **({"past": seq + 2, "total": 2 * seq + 2} if form == "cache" else {})}
    check_against_ort(path, dims=dims, run=run)


def test_form_fuses_as_the_plain_export(exported):
    (family, _, form, _), path = exported
    ops = optimize(trace(OnnxModel(path))).graph.op_counts()
    ops["attention"] = ops.get("attention", 0) + ops.pop("qkv_attention", 0)
    want = dict(FUSED[family])
    if form == "cache":   # the attention over the appended cache is the cache step
        want["append_attention"] = want.pop("attention")
    assert {k: ops.get(k) for k in want} == want
    assert not {"erf", "tanh", "softmax", "layernorm"} & set(ops)
