"""The jinja2 environment for kernel and host templates."""
from __future__ import annotations

import functools
import os

import jinja2

TEMPLATE_DIR = os.path.join(os.path.dirname(__file__), "templates")


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATE_DIR), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, autoescape=False)


def render(template: str, **context) -> str:
    return environment().get_template(template).render(**context)
