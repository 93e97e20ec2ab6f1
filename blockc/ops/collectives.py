"""Collectives across the ranks of a tensor-parallel group: ``all_reduce``
(sum) and ``all_gather`` (along an axis).

The sharding pass (``passes/shard.py``) puts them into each rank's graph::

    %44:f32[batch,seq,64] = matmul %43, @blocks.0.attn.w_o.weight   (rows of w_o: a partial sum)
    %45:f32[batch,seq,64] = all_reduce %44 {world=2}
    %54:f32[batch,seq,128] = matmul %53, @lm_head.weight            (columns: this rank's vocabulary)
    %55:f32[batch,seq,256] = all_gather %54 {axis=-1, world=2}

``world`` is the group's size. Their meaning over the peers' values is
``reduce_peers`` and ``gather_peers``, declared as their ``peers`` rule
(what the tensor-parallel reference, ``runtime/tp_reference.py``, runs);
a single process is a group of one, where both are the identity on every
target (the reference interpreter, PyTorch, ONNX's ``Identity``); a graph
of ``world > 1`` needs its peers, so the interpreter refuses it.
PyTorch runs them as ``torch.distributed`` calls on the default process
group that the launcher (``parallel/launch.py``, or ``torchrun``) set up;
ONNX writes them as ONNX Runtime's ``com.microsoft`` ``AllReduce`` and
``AllGather``, which only an ONNX Runtime built with NCCL or MPI runs (the
standard wheel is not).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import BlockcError, ShapeError
from ._rules import norm_axis
from .fused_onnx import MS
from .registry import INT, REQUIRED, define


def reduce_peers(values: Sequence[np.ndarray]) -> np.ndarray:
    """What ``all_reduce`` gives every rank: the sum of the ranks' values."""
    return np.sum(np.stack(values), axis=0).astype(values[0].dtype)


def gather_peers(values: Sequence[np.ndarray], axis: int) -> np.ndarray:
    """What ``all_gather`` gives every rank: the ranks' values in rank order along ``axis``."""
    return np.concatenate(list(values), axis=axis)


def _every_rank(meaning):
    """A ``peers`` rule that gives every rank the same value: ``meaning`` of
    the ranks' inputs (one each) and the node's attributes."""
    return lambda inputs, attrs: [[meaning([xs[0] for xs in inputs], attrs)]] * len(inputs)


def _alone(name: str, attrs, x: np.ndarray) -> list[np.ndarray]:
    if attrs["world"] != 1:
        raise BlockcError(f"{name} over {attrs['world']} ranks needs its peers' values: a rank's graph runs "
                          f"under the tensor-parallel launcher (blockc.parallel.launch) or torchrun, "
                          f"not on its own")
    return [x]


def _world(name: str, attrs) -> int:
    if attrs["world"] < 1:
        raise ShapeError(f"{name}: world={attrs['world']} is not a group size")
    return attrs["world"]


all_reduce = define("all_reduce", ("x",), attrs={"world": (INT, REQUIRED)}, flops=1, collective=True,
                    doc="sum of x over the ranks of the tensor-parallel group")


@all_reduce.infer
def _(types, attrs):
    _world("all_reduce", attrs)
    return types[0]


all_reduce.numpy(lambda xs, attrs, env: _alone("all_reduce", attrs, xs[0]))
all_reduce.peers(_every_rank(lambda values, attrs: reduce_peers(values)))


@all_reduce.onnx
def _(e, node, ins):
    if node.attrs["world"] == 1:
        return [e.emit("Identity", ins)]
    return [e.emit("AllReduce", ins, domain=MS, group_size=node.attrs["world"], reduction="sum")]


def torch_all_reduce(x):
    """``dist.all_reduce`` as a function of its input: it sums in place, so
    into a copy (the input may be a value another node still reads)."""
    import torch.distributed as dist
    out = x.clone()
    dist.all_reduce(out)
    return out


all_reduce.torch(lambda b, node, xs: xs[0] if node.attrs["world"] == 1 else b.call(torch_all_reduce, xs[0]))

all_gather = define("all_gather", ("x",), attrs={"axis": (INT, REQUIRED), "world": (INT, REQUIRED)}, flops=0,
                    collective=True,
                    doc="the ranks' x concatenated along axis in rank order")


@all_gather.infer
def _(types, attrs):
    (x,), world = types, _world("all_gather", attrs)
    axis = norm_axis("all_gather", attrs["axis"], x.rank)
    return x.with_shape(d * world if i == axis else d for i, d in enumerate(x.shape))


all_gather.numpy(lambda xs, attrs, env: _alone("all_gather", attrs, xs[0]))
all_gather.peers(_every_rank(lambda values, attrs: gather_peers(values, attrs["axis"])))


@all_gather.onnx
def _(e, node, ins):
    if node.attrs["world"] == 1:
        return [e.emit("Identity", ins)]
    return [e.emit("AllGather", ins, domain=MS, group_size=node.attrs["world"], axis=node.attrs["axis"])]


def torch_all_gather(x, axis: int, world: int):
    """``dist.all_gather`` into one tensor, the parts in rank order along ``axis``."""
    import torch
    import torch.distributed as dist
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=axis)


all_gather.torch(lambda b, node, xs: xs[0] if node.attrs["world"] == 1
                 else b.call(torch_all_gather, xs[0], node.attrs["axis"], node.attrs["world"]))


def torch_broadcast(values: np.ndarray, src: int = 0) -> np.ndarray:
    """Rank ``src``'s ``values`` on every rank of the default process group
    (``dist.broadcast``); each other rank passes an array of the same shape
    and dtype, whose contents are replaced. Not an IR op: the generation
    loop's ranks share their picked tokens with it (``generate/agreement.py``)."""
    import torch
    import torch.distributed as dist
    tensor = torch.from_numpy(np.array(values, copy=True))
    dist.broadcast(tensor, src)
    return tensor.numpy()
