"""blockc.process.run_command: the one runner of child programs with a deadline."""
import os
import sys
import time

from blockc.process import run_command


def _gone(pid: int) -> bool:
    """The process ``pid`` has exited (a zombie awaiting its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_output_and_status_come_back_as_text():
    done = run_command([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"],
                       timeout=60)
    assert (done.returncode, done.stdout, done.stderr, done.timed_out) == (3, "out\n", "err\n", False)


def test_env_and_cwd_reach_the_child(tmp_path):
    done = run_command([sys.executable, "-c", "import os; print(os.environ['BLOCKC_PROBE'], os.getcwd())"],
                       timeout=60, cwd=tmp_path, env={**os.environ, "BLOCKC_PROBE": "here"})
    assert done.stdout.split() == ["here", str(tmp_path)]


def test_a_deadline_kills_what_the_child_started_too():
    """A driver's own children (g++'s cc1plus) hold its pipes: killing only the
    driver would leave the call waiting for them. The grandchild here prints its
    pid and sleeps; the call comes back with the output so far and the grandchild dead."""
    script = "sleep 600 & echo $!; echo started >&2; wait"
    done = run_command(["sh", "-c", script], timeout=5)
    assert done.timed_out and done.returncode is None
    assert done.stderr == "started\n"
    pid = int(done.stdout)
    for _ in range(100):   # SIGKILL is delivered asynchronously: give the kernel a moment
        if _gone(pid):
            break
        time.sleep(0.05)
    assert _gone(pid), f"the grandchild {pid} outlived the deadline"
