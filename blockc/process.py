"""Running a child program with a deadline: the one way blockc does it.

A compiler driver (g++, nvcc) starts programs of its own (cc1plus, as,
ptxas) that inherit its output pipes. ``subprocess.run(timeout=)`` kills
only the driver, then waits for the pipes to close: for the grandchildren
to finish, however long they take. Here the child leads a process group of
its own and the whole group is killed at the deadline, so a timeout ends
when it says; an interrupt (Ctrl-C) in the parent kills the group too,
since the child, in its own session, no longer hears the terminal's.

    done = run_command(["g++", ...], timeout=600)
    if done.timed_out: ...            # killed at the deadline; the output so far is kept
    elif done.returncode != 0: ...    # done.stdout, done.stderr as text
"""
from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from typing import Mapping, Sequence


@dataclass(frozen=True)
class Finished:
    """What a child left: its exit status (None when killed at the deadline) and its output as text."""

    command: tuple[str, ...]
    returncode: int | None
    stdout: str
    stderr: str

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:   # the group is already gone
        pass


def run_command(command: Sequence[str | os.PathLike], *, timeout: float, cwd: str | os.PathLike | None = None,
                env: Mapping[str, str] | None = None) -> Finished:
    """Run ``command`` (no stdin) until it exits or ``timeout`` seconds pass;
    at the deadline kill it and everything it started. Raises OSError when
    the program cannot be started."""
    command = tuple(str(c) for c in command)
    proc = subprocess.Popen(command, cwd=cwd, env=None if env is None else dict(env), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return Finished(command, proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()   # the pipes close now: every writer is dead
        return Finished(command, None, out, err)
    except BaseException:
        _kill_group(proc)
        proc.wait()
        raise
