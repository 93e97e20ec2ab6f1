"""Optimum's ONNX exports (``optimum-onnx``'s ``python -m
optimum.exporters.onnx``) of a checkpoint directory made by ``hf_dirs``,
offline: the plain decoder (``--task text-generation``) and the cache step
(``text-generation-with-past``: ``past_key_values.*`` in, ``present.*`` out,
the mask ``past_sequence_length + sequence_length`` long) import, fuse and
match ONNX Runtime on the file at two sequence lengths.

optimum-onnx pins its own transformers, so it runs in an environment of its
own: ``BLOCKC_OPTIMUM_PYTHON`` names that environment's interpreter; without
it these tests skip, saying so.

Its exporter is TorchScript's with Hugging Face's SDPA attention, whose
additive mask is a boolean one, ``where(allowed, 0, -inf)``, with a NaN
guard after the softmax for the rows it masks whole: attention fuses with
``allowed`` as its mask and ``guarded`` (``fuse_attention``;
tests/frontends/test_onnx_sdpa_mask.py holds the pattern without Optimum),
so the counts are the plain export's. In the with-past file each layer's
cache is ``concat(past, new)`` and the attention over it one cache step,
``append_attention`` (``fuse_cache_attention``), and ``generate`` on it gives
Hugging Face's greedy tokens.
"""
import os
import subprocess

import pytest

from blockc import optimize
from blockc.errors import BlockcError
from blockc.frontends import trace
from blockc.frontends.onnx import OnnxModel

from hf_dirs import save_hf_dir
from test_onnx_import import check_against_ort

PYTHON = os.environ.get("BLOCKC_OPTIMUM_PYTHON")
pytestmark = pytest.mark.skipif(not PYTHON, reason="BLOCKC_OPTIMUM_PYTHON (a Python with optimum-onnx) is not set")

L = 2   # hf_dirs' layers
NORMS = {"gpt2": {"add_layernorm": 2 * L + 1}, "llama": {"rmsnorm": 1, "add_rmsnorm": 2 * L, "rotary": 2 * L}}
TASKS = ("text-generation", "text-generation-with-past")


@pytest.fixture(scope="module", params=[(f, t) for f in NORMS for t in TASKS], ids="-".join)
def optimum_file(request, tmp_path_factory):
    family, task = request.param
    folder = tmp_path_factory.mktemp("optimum")
    save_hf_dir(family, folder / "hf")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    run = subprocess.run([PYTHON, "-m", "optimum.exporters.onnx", "--model", str(folder / "hf"), "--task", task,
                          str(folder / "onnx")], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return family, task, folder / "onnx" / "model.onnx"


@pytest.mark.parametrize("run", ["reference", "fused-ort", "fused-ort-contrib", "fused-ort-onnx23"])
def test_optimum_export_matches_ort(optimum_file, run):
    family, task, path = optimum_file
    model, graph = check_against_ort(path, dims=lambda seq: {"past_sequence_length": seq + 2}, run=run)
    if task.endswith("with-past"):
        # the mask's length is the keys': one symbol fewer than the file's names
        mask = next(s for s in model.inputs() if s.name == "attention_mask")
        assert str(mask.shape[1]) == "past_sequence_length+sequence_length"
        assert graph.symbols() == ["batch_size", "sequence_length", "past_sequence_length"]


def test_optimum_export_fuses(optimum_file):
    family, task, path = optimum_file
    ops = optimize(trace(OnnxModel(path))).graph.op_counts()
    step = "append_attention" if task.endswith("with-past") else "attention"
    want = {**NORMS[family], step: L}
    assert {k: ops.get(k) for k in want} == want
    assert not {"erf", "tanh", "softmax", "layernorm"} & set(ops)


PROMPT = [5, 17, 33, 2, 99, 140]
NEW = 8


def test_optimum_with_past_file_generates_hugging_faces_tokens(optimum_file):
    """blockc's loop on the with-past file, its pairs found by name (past_key_values.N.key ->
    present.N.key), picks Hugging Face's greedy tokens on the directory the file was exported from."""
    family, task, path = optimum_file
    if not task.endswith("with-past"):
        pytest.skip("the plain decoder file carries no cache to generate with")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from blockc.frontends.onnx.decoder import OnnxDecoder
    from blockc.generate.loop import generate
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent.parent / "hf"))
    ids = torch.tensor([PROMPT])
    want = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, min_new_tokens=NEW,
                       do_sample=False)[0, len(PROMPT):].tolist()
    assert len(set(want)) >= 2   # not one token repeated: the cache steps are exercised
    decoder = OnnxDecoder(path)
    weights = decoder.init_weights()
    assert generate(decoder, weights, [PROMPT], NEW, cache="concat").tokens == [want]
    # each present is its past with the step appended: the in-place cache does not apply, and says so
    with pytest.raises(BlockcError, match=r"cannot be written in place .* --cache concat"):
        generate(decoder, weights, [PROMPT], 2, cache="inplace")
