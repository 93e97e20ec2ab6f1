"""The whole suite's conftest: keeps pytest-xdist from making a module's
shared fixture twice.

CI runs the suite on every core (``pytest -n auto --dist loadgroup``, see
.ci/run). Each xdist worker is its own process, so a module-scoped fixture (an
ONNX export, an emulated build, a timed comparison) is made again in every
worker that runs one of its tests. Here each test that uses such a fixture
joins the ``xdist_group`` named after it (and after its parameter, so that the
cases of a parametrized fixture still spread over the workers): loadgroup then
runs the group in one worker, which makes the fixture once. A test already
marked with a group keeps it (two fixtures that share a file, as in
frontends/test_onnx_import.py). Without ``-n`` the marks change nothing.
The tests marked ``long`` are collected first, so that a worker starts
them early rather than in the run's tail (``long_tests_first``).
"""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from xdist_groups import long_tests_first, module_fixture_group  # noqa: E402


@pytest.hookimpl(tryfirst=True)   # before xdist's own hook reads the marks
def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            group = module_fixture_group(item)
            if group is not None:
                item.add_marker(pytest.mark.xdist_group(group))
    long_tests_first(items)


def _one_thread_per_worker() -> None:
    """Under xdist each worker gets one core: its libraries' thread pools get
    one thread. Left at their defaults, ONNX Runtime's intra-op pool and
    PyTorch's OpenMP pool each size themselves to every core and spin while
    they wait, so two workers ran four spinning threads on two cores (a
    generate and backends subset: 29 s at -n 2 against 19 s with one thread
    each). ``BLOCKC_THREADS`` is blockc's own default for both
    (``runtime/threads.py``), and the peer sessions tests make follow it
    (``ort_sessions.peer_session``); OMP/MKL reach PyTorch's pools before
    blockc sets a count. A test that asks for threads (``threads=2``) still
    gets them; a value set by the user is kept."""
    for variable in ("BLOCKC_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(variable, "1")


if os.environ.get("PYTEST_XDIST_WORKER"):
    _one_thread_per_worker()

# the verifier after every pass, not only on the result, in every test and every process a test starts
os.environ.setdefault("BLOCKC_VERIFY_EACH_PASS", "1")
