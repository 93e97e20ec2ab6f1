"""A rank's part of ``blockc compare --tp N``: each case's step split over
the N ranks beside the same step on one, timed by compare's own method
(``runtime/timing.measure_in_blocks``).

The contestants of a case (a backend and a form), keyed as ``contestant_key``
writes them::

    torch-eager/fused/tp2          the graph split over the ranks, every rank a session
    torch-eager/fused/tp1          the unsplit graph, a session on rank 0 alone
    torch-eager/standard/tp1 (A/A) the standard form's second one-rank session: the A/A control

Each block prepares a *fresh* session of every contestant on every rank (the
weights copied anew into a new ``TorchSession``, torch.compile's code
compiled anew), in an order shuffled alike on every rank, times them in
interleaved rounds and drops them. The sessions are made fresh inside one
launch rather than by a launch per block: what runs persistently apart is
the session (where its weights land), which this repeats; a launch per
block would add each rank's start (a Python with torch, the process group,
the model built and split: seconds on shared cores) to every block and
time nothing more.

The ranks must run in step, so every slice is a fixed count of steps
(``repeats`` per block, spread over the rounds, no minimum time): the
same count on every rank, their collectives paired. While rank 0 runs a
one-rank contestant the other ranks hold no session for it; they wait in
the next split contestant's first collective (an untimed run before each
slice, ``measure_interleaved``), so the one-rank step has the machine as a
single process would.

Each rank writes, per case, ``{out}.timing.json``: its blocks
(``{key: {"samples", "round_medians"}}``), and the split step's
collectives alone (the same ops on tensors of the same shapes, in order:
``collectives_s``, their median, and ``collectives``, their count), from
which compare takes the collectives' share of a step. It writes the split
session's outputs to ``{out}.npz``, and rank 0 the one-rank session's to
``{out}.one.npz``, for compare's check that the two agree.
"""
from __future__ import annotations

import json
import os


def contestant_key(backend: str, form: str, ranks: int, control: str = "") -> str:
    """A contestant's key; ``control``: the suffix of compare's A/A control (``compare.results.AA``), which
    the job carries (``time["control"]``), as compare's meaning, not the ranks'."""
    return f"{backend}/{form}/tp{ranks}{control}"


def case_form(fused: bool) -> str:
    """The form a case runs: ``Case.fused`` as compare names forms."""
    return "fused" if fused else "standard"


def time_job(job: dict, rank: int, world: int) -> None:
    """Every case of ``job`` (``worker.py``) timed as the module says, on this rank."""
    from ..runtime.feeds import load_npz
    from ..runtime.timing import measure_in_blocks
    timing, makers, keys, extra = job["time"], {}, [], []
    for i, case in enumerate(job["cases"]):
        feeds = load_npz(case["feeds"])
        mine, collectives = _contestants(case, feeds, os.path.join(job["out"], f"case{i}.rank{rank}"), rank, world,
                                         timing["control"])
        makers.update(mine)
        keys.append(list(mine))
        extra.append(collectives)
    blocks = measure_in_blocks(makers, blocks=timing["blocks"], rounds=timing["rounds"], warmup=timing["warmup"],
                               min_time_s=0.0, min_repeats=timing["repeats"], seed=timing["seed"])
    for i, (case_keys, collectives) in enumerate(zip(keys, extra)):
        doc = {"blocks": [{k: {"samples": blk[k].samples, "round_medians": blk[k].round_medians}
                           for k in case_keys} for blk in blocks], **collectives(timing)}
        with open(os.path.join(job["out"], f"case{i}.rank{rank}.timing.json"), "w") as f:
            json.dump(doc, f)


def _contestants(case: dict, feeds, out: str, rank: int, world: int, control: str):
    """The case's makers (``measure_in_blocks``'), after one run of each
    whose outputs are kept (``{out}.npz``, rank 0's ``{out}.one.npz``); and
    a function timing the split step's collectives alone."""
    from ..runtime.feeds import save_npz
    from .rank_model import rank_graph_and_weights, rank_session
    backend, form = case["backend"], case_form(case.get("fused"))
    split = rank_graph_and_weights(case, rank, world)
    one = rank_graph_and_weights(case, 0, 1) if rank == 0 else None   # the unsplit graph: shard(tp=1) splits nothing
    save_npz(out + ".npz", rank_session(case, *split).run(feeds))
    if one is not None:
        save_npz(out + ".one.npz", rank_session(case, *one).run(feeds))

    def fresh(graph_and_weights):
        def prepare():
            if graph_and_weights is None:   # a one-rank contestant, on another rank than 0
                return (lambda: None), (lambda: None)
            session = rank_session(case, *graph_and_weights)
            return (lambda: session.run_unchecked(feeds)), (lambda: None)   # dropped with the block
        return prepare
    makers = {contestant_key(backend, form, world): fresh(split), contestant_key(backend, form, 1): fresh(one)}
    if form == "standard":
        makers[contestant_key(backend, form, 1, control)] = fresh(one)
    return makers, lambda timing: time_collectives(split[0], feeds, timing["warmup"], timing["repeats"])


def time_collectives(graph, feeds, warmup: int, repeats: int) -> dict:
    """The median of ``graph``'s collectives alone (the same ops on tensors
    of the same shapes, in the same order), each run a fixed count so the
    ranks stay paired: their share of a step is this over the step's time.
    Each runs as the PyTorch backend runs it, by its op's ``torch`` rule
    (``runtime/torch_runner.eager_lowering``); a collective without one is
    refused by name rather than left out of the share."""
    from ..ops import registry
    from ..runtime.bindings import bind_inputs
    from ..runtime.timing import measure
    from ..runtime.torch_runner import eager_lowering
    bindings = bind_inputs(graph, feeds)
    calls = []
    for n in graph.nodes:
        if registry.get(n.op).collective and n.attrs["world"] > 1:   # a group of one exchanges nothing
            calls.append(_run_alone(eager_lowering(n), n, bindings))
    if not calls:
        return {"collectives_s": 0.0, "collectives": 0}
    fixed = {"warmup": warmup, "min_repeats": repeats, "max_repeats": repeats, "min_time_s": 0.0}
    return {"collectives_s": measure(lambda: [call() for call in calls], **fixed).median_s, "collectives": len(calls)}


def _run_alone(run, node, bindings):
    """``run`` (``node``'s torch rule) on zeros of its inputs' shapes and dtypes at ``bindings``."""
    import torch

    from ..runtime.torch_tensors import TORCH_DTYPES
    inputs = [torch.zeros(v.type.concrete_shape(bindings), dtype=TORCH_DTYPES[v.dtype]) for v in node.inputs]
    return lambda: run(*inputs)
