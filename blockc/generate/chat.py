"""Chat prompts: a directory's chat template rendered as Hugging Face's
``tokenizer.apply_chat_template(messages, add_generation_prompt=True)``.

The template is found where transformers looks: ``chat_template.jinja``
(transformers 5 writes it), with any ``additional_chat_templates/*.jinja``
as named ones, else ``tokenizer_config.json``'s ``chat_template`` (a string,
or a list of ``{"name", "template"}``); of several, ``default`` is used.
It is rendered by jinja2 in transformers' own environment: sandboxed,
``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension and
``{% generation %}`` blocks,
``raise_exception``, ``strftime_now``, and a ``tojson`` that does not escape
HTML and keeps non-ASCII. The template sees ``messages``, ``tools`` and
``documents`` (None), ``add_generation_prompt`` and the named special
tokens (``bos_token``, ``eos_token``, ...). The rendered text is tokenized
without adding special tokens (the template wrote them), as HF does.
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from ..errors import BlockcError
from .text import CONFIG_FILE, TextTokenizer

TEMPLATE_FILE = "chat_template.jinja"
TEMPLATE_DIR = "additional_chat_templates"


def _read(file: Path) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except OSError as e:
        raise BlockcError(f"cannot read {file}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise BlockcError(f"cannot read {file}: a chat template is UTF-8 text") from None


def chat_templates(tokenizer: TextTokenizer) -> dict[str, str]:
    """Every chat template of the directory by name (``default`` for the main one)."""
    path: Path = tokenizer.path
    found = {}
    if (path / TEMPLATE_FILE).is_file():
        found["default"] = _read(path / TEMPLATE_FILE)
    if (path / TEMPLATE_DIR).is_dir():
        found.update({f.stem: _read(f) for f in sorted((path / TEMPLATE_DIR).glob("*.jinja"))})
    if found:
        return found
    stored = tokenizer.config.get("chat_template")
    if isinstance(stored, str):
        return {"default": stored}
    if isinstance(stored, list) and all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                        and isinstance(t.get("template"), str) for t in stored):
        return {t["name"]: t["template"] for t in stored}
    if stored is not None:
        raise BlockcError(f"{path / CONFIG_FILE}: chat_template must be a string or a list of "
                          f"{{\"name\", \"template\"}}, got {type(stored).__name__}")
    return {}


def chat_template(tokenizer: TextTokenizer) -> str:
    """The template ``apply_chat_template`` uses: the only one, or ``default``."""
    templates = chat_templates(tokenizer)
    if not templates:
        raise BlockcError(f"{tokenizer.path} has no chat template (no {TEMPLATE_FILE}, no chat_template in "
                          f"{CONFIG_FILE}): give the prompt as it is, without --chat")
    if len(templates) == 1:
        return next(iter(templates.values()))
    if "default" not in templates:
        raise BlockcError(f"{tokenizer.path} has several chat templates and none named default: "
                          f"{', '.join(sorted(templates))}")
    return templates["default"]


def _environment():
    """transformers' jinja environment for chat templates (``_cached_compile_jinja_template``)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``, which HF uses to mark the
        assistant's tokens for training masks, renders its body unchanged."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda format: datetime.now().strftime(format)
    return env


def render_chat(tokenizer: TextTokenizer, messages: list[dict], *, add_generation_prompt: bool = True) -> str:
    """``apply_chat_template(messages, add_generation_prompt=..., tokenize=False)``."""
    import jinja2
    template = chat_template(tokenizer)
    try:
        return _environment().from_string(template).render(
            messages=messages, tools=None, documents=None, add_generation_prompt=add_generation_prompt,
            **tokenizer.special_tokens())
    except jinja2.TemplateError as e:
        raise BlockcError(f"{tokenizer.path}: the chat template failed: {e}") from None
    except Exception as e:   # a template is code from the directory: whatever it raises is its failure
        raise BlockcError(f"{tokenizer.path}: the chat template failed: {type(e).__name__}: {e}") from None


def user_messages(text: str, system: str | None = None) -> list[dict]:
    """One prompt as a conversation: an optional system message, then the user's."""
    head = [{"role": "system", "content": system}] if system is not None else []
    return head + [{"role": "user", "content": text}]


def chat_ids(tokenizer: TextTokenizer, messages: list[dict]) -> list[int]:
    """``apply_chat_template(messages, add_generation_prompt=True)``'s ids:
    the rendered text tokenized without special tokens added a second time."""
    return tokenizer.encode(render_chat(tokenizer, messages), add_special_tokens=False)


def encode_prompts(tokenizer: TextTokenizer, texts: list[str], *, chat: bool = False,
                   system: str | None = None) -> list[list[int]]:
    """Each ``--prompt`` as ids: tokenized as ``tokenizer(text)`` (special
    tokens as the directory adds them), or with ``chat`` as one user message
    (after ``system``, if given) through the chat template."""
    if system is not None and not chat:
        raise BlockcError("a system message is part of a chat: give --chat with --system")
    prompts = []
    for k, text in enumerate(texts):
        ids = chat_ids(tokenizer, user_messages(text, system)) if chat else tokenizer.encode(text)
        if not ids:
            raise BlockcError(f"prompt {k} ({text!r}) tokenizes to no tokens: give some text")
        prompts.append(ids)
    return prompts
