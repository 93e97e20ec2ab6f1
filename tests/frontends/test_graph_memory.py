"""The up-front estimate of a graph's memory against a measurement: what
tracing and exporting a deep model really holds (bench/graph_memory.py, in a
fresh process), so the estimate cannot drift from the IR it describes."""
import json
import os
import subprocess
import sys

from blockc.frontends.module import GRAPH_BYTES_PER_PARAMETER

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "graph_memory.py")


def measured(form: str, layers: int = 256) -> dict:
    """``bench/graph_memory.py``'s figures for ``blockc export tiny --set layers=LAYERS --form FORM --no-weights``."""
    out = subprocess.run([sys.executable, BENCH, "--child", "tiny", str(layers), form], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_the_estimate_is_at_least_what_the_heaviest_form_takes():
    m = measured("decomposed")  # the form the estimate is taken from
    assert m["bytes"] <= m["params"] * GRAPH_BYTES_PER_PARAMETER, m


def test_the_estimate_is_at_most_about_twice_what_the_lightest_form_takes():
    # so that a graph which would fit is not refused far from the limit
    m = measured("standard")
    assert m["params"] * GRAPH_BYTES_PER_PARAMETER <= 2.2 * m["bytes"], m
