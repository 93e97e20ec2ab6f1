"""``blockc models`` and MODEL's help name every kind of model blockc takes."""
import pytest

from blockc.cli import build_parser, main


def test_models_lists_hugging_face_directories(capsys):
    assert main(["models"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("or a Hugging Face checkpoint directory (config.json + safetensors): gpt2, bert")
    assert "qwen3" in last


@pytest.mark.parametrize("command", ["show", "run", "export"])
def test_model_help_names_onnx_files_and_checkpoint_directories(command):
    sub = build_parser()._subparsers._group_actions[0].choices[command]
    text = " ".join(sub.format_help().split())
    assert "path/to/model.onnx or a Hugging Face checkpoint directory" in text
