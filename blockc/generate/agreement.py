"""How the ranks of a tensor-parallel generation stay in step.

Every rank runs the one ``DecodeLoop`` on its part of the model (the
logits are gathered, so each holds all of them), but only rank 0 decides:
it picks each step's tokens (its ``pick``: a seeded sampler draws once, on
one rank) and asks the stopping criteria which rows are done (a clock, stop
strings: what could differ between processes). It then sends both to the
other ranks in one broadcast, and they take them as theirs. So the ranks
run the same steps and end together, whatever the pick or the criteria.

    rank 0:   logits -> pick -> criteria -> broadcast(chosen, done)
    rank 1..: logits -> (chosen, done) = broadcast from rank 0
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ops.collectives import torch_broadcast


@dataclass(frozen=True)
class RankDecisions:
    """This process's part in agreeing: rank 0 ``leads`` and ``send``s; the others ``receive``."""

    rank: int

    @property
    def leads(self) -> bool:
        return self.rank == 0

    def send(self, chosen: np.ndarray, done: np.ndarray) -> None:
        torch_broadcast(np.stack([chosen.astype(np.int64), done.astype(np.int64)]))

    def receive(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """Rank 0's picked ids and done rows for a batch of ``rows``."""
        chosen, done = torch_broadcast(np.zeros((2, rows), np.int64))
        return chosen, done.astype(bool)
