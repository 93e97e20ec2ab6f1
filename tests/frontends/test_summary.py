"""Parameter counts: exact totals of known models and the 12·L·d² rule of thumb."""
import pytest

from blockc import build_model
from blockc.frontends import InputSpec, Linear, Model, ModuleList, Parameter
from blockc.frontends.summary import summarize
from blockc.ir.dtypes import DType


def test_gpt2_small_has_124m_parameters():
    s = summarize(build_model("gpt2"))
    # GPT-2 small as Hugging Face counts it (GPT2Model; the tied head adds none).
    assert s.total == 124_439_808
    assert s.embedding == 50257 * 768 + 1024 * 768
    assert s.non_embedding == s.total - s.embedding
    assert s.estimate == 12 * 12 * 768 ** 2
    assert abs(s.non_embedding / s.estimate - 1) < 0.03


def test_bert_base_non_embedding_near_12_l_d2():
    s = summarize(build_model("bert-base"))
    # token + position + segment tables
    assert s.embedding == (30522 + 512 + 2) * 768
    assert s.layers == 12 and s.d_model == 768
    assert abs(s.estimate_error) < 0.03
    # blocks alone: 12 × (4·(d² + d) + 2·d·4d + 4d + d + 2·2d)
    d = 768
    block = 4 * (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d) + 2 * 2 * d
    assert dict((m.name, m.params) for m in s.modules)["blocks"] == 12 * block


def test_tiny_counts_by_module_and_type():
    s = summarize(build_model("tiny"))
    d, ff, vocab, positions, layers = 64, 256, 256, 128, 2
    block = 4 * (d * d + d) + (d * ff + ff) + (ff * d + d) + 2 * 2 * d
    assert [(m.name, m.params) for m in s.modules] == [
        ("tok", vocab * d), ("pos", positions * d), ("blocks", layers * block), ("ln_f", 2 * d)]
    assert s.total == vocab * d + positions * d + layers * block + 2 * d
    assert s.by_type == {"Embedding": vocab * d, "LearnedPositionEmbedding": positions * d,
                         "Linear": layers * (block - 4 * d), "LayerNorm": layers * 4 * d + 2 * d}
    assert sum(s.by_type.values()) == s.total


def test_tiny_format():
    s = summarize(build_model("tiny"))
    text = s.format()
    assert str(s) == text
    lines = text.splitlines()
    assert lines[0] == "tiny (DecoderLM): 124,672 parameters (124.7K)"
    assert any(line.split() == ["blocks", "2", "×", "TransformerBlock", "99,968", "80.2%"] for line in lines)
    assert any(line.split()[:2] == ["total", "124,672"] for line in lines)
    assert any(line.split()[:2] == ["embedding", "24,576"] for line in lines)
    assert any(line.split()[:2] == ["non-embedding", "100,096"] for line in lines)
    assert "12·L·d²" in text and "98,304" in text and "+1.82%" in text
    # plain text: no terminal escape codes
    assert "\x1b" not in text


def test_rich_table_renders():
    from rich.console import Console

    console = Console(width=100, record=True, color_system=None)
    console.print(summarize(build_model("tiny")).to_rich())
    out = console.export_text()
    assert "124,672" in out and "LearnedPositionEmbedding" in out


def test_shared_parameters_count_once_and_models_without_config():
    class Shared(Model):
        name = "shared"

        def __init__(self):
            super().__init__()
            lin = Linear(8, 8)
            self.layers = ModuleList([lin, lin])
            self.scale = Parameter((8,), "ones")

        def inputs(self):
            return [InputSpec("x", DType.float32, (2, 8))]

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x * self.scale

    s = summarize(Shared())
    assert s.total == 8 * 8 + 8 + 8
    assert [(m.name, m.params) for m in s.modules] == [("(own)", 8), ("layers", 72)]
    assert s.estimate is None and s.embedding == 0
    assert "12·L·d²" not in s.format()


@pytest.mark.parametrize("name", ["gpt2-block", "bert-base"])
def test_every_builtin_formats(name):
    assert f"{summarize(build_model(name)).total:,}" in summarize(build_model(name)).format()


def test_summary_counts_from_the_module_tree_without_tracing(monkeypatch, capsys):
    # `blockc summary gpt2 --set layers=100000` took 433 s when it traced the graph first.
    import blockc.frontends
    from blockc.cli import main

    def no_trace(*args, **kw):
        raise AssertionError("blockc summary traced the model")

    monkeypatch.setattr(blockc.frontends, "trace", no_trace)
    assert main(["summary", "gpt2", "--set", "layers=24"]) == 0
    # 24 layers of 12·d² + 4 biases/norms: gpt2-medium-shaped, d=768
    assert "gpt2 (DecoderLM): 209," in capsys.readouterr().out
