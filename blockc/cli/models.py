"""``blockc models``: the built-in models and their settings."""
from __future__ import annotations

NAME = "models"
HELP = "list the built-in models and their settings"
DESCRIPTION = "List the built-in models, their settings and defaults."


def add_arguments(p) -> None:
    """It takes none."""


def run(args) -> int:
    import dataclasses
    from ..frontends.catalog import BUILTINS, DEFAULT_MODEL
    for b in BUILTINS.values():
        mark = " (default)" if b.name == DEFAULT_MODEL else ""
        print(f"{b.name}{mark}\n    {b.about}")
        fields = {f.name: f.default for f in dataclasses.fields(b.config)}
        fields.update(b.defaults)
        print("    settings: " + ", ".join(f"{k}={v}" for k, v in fields.items()))
    print("\nor your own: path/to/file.py:name (a blockc.Model, a Model subclass, or a function returning one)")
    print("or a Hugging Face checkpoint directory (config.json + safetensors): gpt2, bert, roberta, llama, mistral, "
          "qwen2, qwen3")
    return 0
