"""The folder a carried registration names is the one that makes its class's
module importable, however deep the module sits in its package."""
from __future__ import annotations

import importlib
import sys

import pytest
from registry_testing import registered_torch_backend

from blockc.parallel.rank_backend import carried_registration

pytest.importorskip("torch")
CLASS = "from blockc.runtime.backends.pytorch import TorchBackend\n\n\nclass Mine(TorchBackend):\n    pass\n"


@pytest.mark.parametrize("module, file", [("top_mod", "top_mod.py"),
                                          ("pkg_a", "pkg_a/__init__.py"),
                                          ("pkg_b.inner.leaf", "pkg_b/inner/leaf.py")])
def test_the_carried_path_is_the_parent_of_the_top_package(tmp_path, monkeypatch, module, file):
    (tmp_path / file).parent.mkdir(parents=True, exist_ok=True)
    for folder in (tmp_path / file).relative_to(tmp_path).parents[:-1]:   # each package on the way, not tmp_path
        (tmp_path / folder / "__init__.py").touch()
    (tmp_path / file).write_text(CLASS)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        cls = importlib.import_module(module).Mine
        with registered_torch_backend("torch-mine", cls=cls) as name:
            carried = carried_registration(name)
    finally:
        for loaded in [m for m in sys.modules if m.split(".")[0] == module.split(".")[0]]:
            del sys.modules[loaded]
    assert carried["cls"] == f"{module}:Mine"
    assert carried["path"] == [str(tmp_path)]
