"""The pass manager pauses Python's cyclic garbage collector while the
pipeline runs (see ``_collector_paused``) and always gives it back as it was."""
import gc

import pytest

import blockc
from blockc.errors import BlockcError
from blockc.passes import manager


@pytest.fixture
def collector():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_off_during_the_passes_and_left_as_it_was(enabled, collector, monkeypatch):
    g = blockc.trace(blockc.build_model("tiny"))
    (gc.enable if enabled else gc.disable)()
    seen = []
    real = manager.verify
    monkeypatch.setattr(manager, "verify", lambda graph: (seen.append(gc.isenabled()), real(graph)))
    blockc.optimize(g)
    assert seen and not any(seen)
    assert gc.isenabled() == enabled

    monkeypatch.setattr(manager, "verify", lambda graph: (_ for _ in ()).throw(BlockcError("broken")))
    with pytest.raises(BlockcError, match="broken"):
        blockc.optimize(g)
    assert gc.isenabled() == enabled
