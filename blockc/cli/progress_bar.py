"""The progress bar long commands (export, compare) draw on a terminal."""
from __future__ import annotations

import sys
import time

# A job that ends sooner than this shows no progress bar: a quick export
# prints what it always did, with no bar flashing by.
PROGRESS_DELAY_S = 1.0
# Where no bar can be drawn (a pipe, a log), compare's progress is a line at
# most this often: a few lines a minute, never minutes of silence.
PROGRESS_LINE_S = 15.0


class ProgressBar:
    """A ``blockc.progress`` callback that draws a rich progress bar, one line
    a stage, on ``stream`` (stderr), and only where that is a terminal and the
    job has run ``delay`` seconds: pipes, files and tests see nothing, unless
    ``lines_every`` is given (a job of minutes, such as compare): then they
    get a plain line, where the job stands, at most that many seconds apart,
    so a log is never minutes of silence. Stages reported before the bar
    appears are shown as they stand. A context manager: the bar is removed
    when the job ends, however it ends."""

    def __init__(self, stream=None, delay: float = PROGRESS_DELAY_S, show: bool = True,
                 lines_every: float | None = None):
        self.stream = stream if stream is not None else sys.stderr
        terminal = self.stream.isatty()
        self.show = show and terminal
        self.lines_every = lines_every if show and not terminal else None
        self.delay, self.started = delay, time.perf_counter()
        self.last_line = None
        self.stages: dict[str, tuple[int, int, str]] = {}
        self.bar, self.tasks = None, {}

    def _line(self, stage: str, done: int, total: int, detail: str) -> None:
        now = time.perf_counter()
        if self.last_line is not None and now - self.last_line < self.lines_every and done < total:
            return
        self.last_line, spent = now, now - self.started
        left = f", about {spent / done * (total - done):.0f} s left" if 0 < done < total else ""   # as the bar's
        self.stream.write(f"{stage} {done}/{total}{': ' + detail if detail else ''} ({spent:.0f} s so far{left})\n")
        self.stream.flush()

    def __call__(self, stage: str, done: int, total: int, detail: str = "") -> None:
        if self.lines_every is not None:
            self._line(stage, done, total, detail)
        if not self.show:
            return
        self.stages[stage] = (done, total, detail)
        if self.bar is None:
            if time.perf_counter() - self.started < self.delay:
                return
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
            # time remaining, not elapsed: a stage begun before the bar appeared would show too little
            self.bar = Progress(TextColumn("{task.description:<24}"), BarColumn(), MofNCompleteColumn(),
                                TimeRemainingColumn(), TextColumn("{task.fields[detail]}"), transient=True,
                                console=Console(file=self.stream, force_terminal=True))
            self.bar.start()
        for name, (done, total, detail) in self.stages.items():  # a handful: every stage the job has begun
            if name not in self.tasks:
                self.tasks[name] = self.bar.add_task(name, total=total, detail=detail)
            self.bar.update(self.tasks[name], completed=done, total=total, detail=detail)

    def __enter__(self) -> "ProgressBar":
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()
