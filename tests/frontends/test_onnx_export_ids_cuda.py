"""The simplest export, ``input_ids`` alone, runs on the CUDA backend: its
graph holds Hugging Face's packed-sequence search, a ``CumSum`` over the
positions, which the CUDA backend runs as a scan (codegen/cuda/kernels/scan.py).
GPT-2 of one tiny layer, exported by the dynamo exporter, imported, optimized
and emulated on the CPU, against ONNX Runtime on the file at two lengths.
(The export forms' own matrix is test_onnx_export_forms.py.)"""
import warnings

import pytest

from blockc.frontends import trace
from blockc.frontends.onnx import OnnxModel

from test_onnx_import import check_against_ort

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxscript")   # the dynamo exporter writes its ONNX with it

from hf_testing import randomise  # noqa: E402


@pytest.fixture(scope="module")
def ids_only(tmp_path_factory):
    cfg = transformers.GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2, n_positions=32)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = randomise(transformers.GPT2LMHeadModel(cfg), torch)

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = hf

        def forward(self, input_ids):
            return self.m(input_ids=input_ids, use_cache=False, return_dict=True).logits

    path = tmp_path_factory.mktemp("ids") / "gpt2.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Logits().eval(), (torch.randint(0, 64, (2, 5)),), str(path), input_names=["input_ids"],
                          output_names=["logits"], dynamic_axes={"input_ids": {0: "batch", 1: "sequence"}},
                          opset_version=18, dynamo=True, verbose=False)
    return path


def test_the_export_holds_a_cumsum(ids_only):
    assert "cumsum" in trace(OnnxModel(ids_only)).op_counts()


def test_ids_only_export_runs_emulated_as_ort_runs_it(ids_only):
    check_against_ort(ids_only, run="fused-cuda-emu")
