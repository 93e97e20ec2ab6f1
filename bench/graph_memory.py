"""What tracing and exporting a deep model holds in memory, per declared
parameter: the measurement behind ``GRAPH_BYTES_PER_PARAMETER``
(``blockc/frontends/module.py``), with which ``blockc.trace`` refuses a
graph that cannot fit before tracing it.

    python bench/graph_memory.py [--models gpt2,bert-base,tiny] [--layers 512,2000] [--forms standard,fused,decomposed]

Each run is a fresh subprocess doing what ``blockc export MODEL --set
layers=L --form FORM --no-weights`` does: build the model, trace it, put the
graph in the form, export it to ONNX (building the ModelProto, checking it,
writing it to a temporary folder). A 1-layer model is exported first, so
lazy imports do not count. The figure is the peak resident memory
(``VmHWM``) less the resident memory once the model is built (``VmRSS``):
the IR, its formed copy and the ONNX graph, not the interpreter or the
module tree. (``VmHWM``, not ``getrusage``'s ``ru_maxrss``: Linux carries
``ru_maxrss`` over ``exec``, so a child of a big process, pytest with torch
loaded, would report its parent's size.)

Per declared parameter, because that is what can be counted without tracing:
a Linear is a matmul and an add for its two parameters, a norm one node for
two, attention's shape ops ride on its projections, so the built-in models
(and examples/custom_model.py) trace to about two nodes per parameter
whatever their width. Prints a markdown table and the worst figure against
the constant.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def status(field: str) -> int:
    """A memory figure of this process from ``/proc/self/status``, in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def child(model_name: str, layers: int, form: str) -> dict:
    import blockc
    from blockc.codegen.onnx_export import save_onnx

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "m.onnx")
        save_onnx(blockc.to_form(blockc.trace(blockc.build_model(model_name, {"layers": "1"})), form), None, path)
        model = blockc.build_model(model_name, {"layers": str(layers)})
        params = sum(1 for _ in model.named_parameters())
        base = status("VmRSS")
        graph = blockc.to_form(blockc.trace(model), form)
        nodes = len(graph.nodes)
        save_onnx(graph, None, path)
        peak = status("VmHWM")
    return {"model": model_name, "layers": layers, "form": form, "params": params, "nodes": nodes,
            "bytes": peak - base}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="gpt2,bert-base,tiny")
    ap.add_argument("--layers", default="512,2000")
    ap.add_argument("--forms", default="standard,fused,decomposed")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.child[2])))
        return
    from blockc.files import format_bytes
    from blockc.frontends.module import GRAPH_BYTES_PER_PARAMETER
    rows = []
    for model in args.models.split(","):
        for layers in map(int, args.layers.split(",")):
            for form in args.forms.split(","):
                out = subprocess.run([sys.executable, __file__, "--child", model, str(layers), form],
                                     check=True, capture_output=True, text=True).stdout
                rows.append(json.loads(out.strip().splitlines()[-1]))
                r = rows[-1]
                print(f"{model} L={layers} {form}: {format_bytes(r['bytes'])}", file=sys.stderr)
    print("| model | layers | form | parameters | IR nodes | peak over the built model | per parameter | per layer |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['model']} | {r['layers']} | {r['form']} | {r['params']:,} | {r['nodes']:,} | "
              f"{format_bytes(r['bytes'])} | {format_bytes(r['bytes'] / r['params'])} | "
              f"{format_bytes(r['bytes'] / r['layers'])} |")
    worst = max(rows, key=lambda r: r["bytes"] / r["params"])
    print(f"\nworst: {format_bytes(worst['bytes'] / worst['params'])} a parameter ({worst['model']}, "
          f"{worst['layers']} layers, {worst['form']}); GRAPH_BYTES_PER_PARAMETER is "
          f"{format_bytes(GRAPH_BYTES_PER_PARAMETER)}, {GRAPH_BYTES_PER_PARAMETER * worst['params'] / worst['bytes']:.2f}x it")


if __name__ == "__main__":
    main()
