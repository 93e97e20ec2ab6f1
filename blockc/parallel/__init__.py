"""Tensor-parallel runs across processes: the launcher (``launch.py``) and
one rank (``worker.py``), above ``generate`` because a rank may run the
generation loop. The collectives are ops (``ops/collectives.py``), the split
is a pass (``passes/shard.py``); this package starts, feeds and ends ranks."""
