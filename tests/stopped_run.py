"""A command stopped part way (SIGSTOP) for as long as a test needs: a run under way, to start a second beside it."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def start(cmd: list[str], ready: str) -> subprocess.Popen:
    """`cmd` started from the repository with its output piped, once it has printed a line with `ready` on stderr."""
    process = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
    for line in process.stderr:
        if ready in line:
            return process
    raise AssertionError(f"{cmd[3:5]} ended without saying {ready!r}: {process.communicate()}")


def stopped(cmd: list[str], ready: str) -> subprocess.Popen:
    """`cmd` stopped, with the processes it started, once it has printed `ready` on stderr; `resume_and_wait` lets
    it finish."""
    process = start(cmd, ready)
    os.killpg(process.pid, signal.SIGSTOP)
    return process


def resume_and_wait(process: subprocess.Popen, timeout: float = 600) -> tuple[str, str]:
    os.killpg(process.pid, signal.SIGCONT)
    return process.communicate(timeout=timeout)
