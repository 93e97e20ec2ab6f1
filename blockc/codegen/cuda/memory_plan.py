"""The static memory plan: intermediate buffers share arena slots by liveness.

Slot assignment is fixed when the code is generated; slot sizes are C
expressions of the run-time dims (a slot is as large as its largest buffer),
so one plan serves every ``batch``/``seq``. A buffer may reuse a slot only
once the slot's previous buffer has been read for the last time by an
*earlier* launch (a kernel never writes where it is still reading).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ...ir.dims import evaluate
from ...ir.graph import Value


@dataclass
class Slot:
    buffers: list = field(default_factory=list)   # Values, in time order
    free_after: int = -1                          # last step reading the current buffer


@dataclass
class MemoryPlan:
    slots: list[Slot]
    slot_of: dict                                 # id(Value) -> slot index

    def arena_bytes(self, bindings: Mapping[str, int], align: int = 256) -> int:
        total = 0
        for slot in self.slots:
            size = max(_nbytes(v, bindings) for v in slot.buffers)
            total += (size + align - 1) // align * align
        return total

    def naive_bytes(self, bindings: Mapping[str, int], align: int = 256) -> int:
        return sum((_nbytes(v, bindings) + align - 1) // align * align for s in self.slots for v in s.buffers)


def _nbytes(v: Value, bindings) -> int:
    n = v.dtype.itemsize
    for d in v.shape:
        n *= evaluate(d, bindings)
    return n


def plan_memory(buffers: list[Value], defined_at: Mapping[int, int], last_use: Mapping[int, int]) -> MemoryPlan:
    """Assign each buffer (in definition order) to a slot free by then,
    preferring a slot whose last buffer has the same type (same size at any dims)."""
    slots: list[Slot] = []
    slot_of: dict[int, int] = {}
    for v in sorted(buffers, key=lambda v: defined_at[id(v)]):
        step = defined_at[id(v)]
        free = [i for i, s in enumerate(slots) if s.free_after < step]
        same = [i for i in free if slots[i].buffers[-1].type == v.type]
        if same or free:
            k = (same or free)[0]
        else:
            slots.append(Slot())
            k = len(slots) - 1
        slots[k].buffers.append(v)
        slots[k].free_after = max(last_use.get(id(v), step), step)
        slot_of[id(v)] = k
    return MemoryPlan(slots, slot_of)
