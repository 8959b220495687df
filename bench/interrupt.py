"""SIGTERM handled as Ctrl-C, for the benchmark's processes.

By default SIGTERM ends a Python process on the spot: a run's `finally` blocks never ran, and the
processes it had started (in sessions of their own, so that a terminal's Ctrl-C reaches only the
run) stayed up, with its PostgreSQL and its temporary folders. Imports nothing of Django's or
Valka's (as bench.measure): the peers' runner imports it from their own virtualenv.
"""

from __future__ import annotations

import signal
import subprocess
from typing import Any

from bench.measure import stop


def stop_on_sigterm() -> None:
    """Make SIGTERM raise KeyboardInterrupt, so the process ends through its cleanups. A second
    SIGTERM (a process group signalled, then the run's own to its child) does not interrupt the
    cleanups the first one started; SIGKILL still ends a cleanup that hangs."""
    def interrupted(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, lambda *_: None)
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)


def run_to_end(cmd: list[str], *, grace: float = 30.0, **popen: Any) -> subprocess.CompletedProcess[str]:
    """`subprocess.run(cmd, stdout=PIPE, text=True, check=True)`, except that when this process is
    interrupted the child gets SIGTERM and `grace` seconds to clean up (its own stack) before it
    is killed; `subprocess.run` kills it at once."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, **popen) as proc:
        try:
            out, _ = proc.communicate()
        except BaseException:
            stop(proc, grace)
            raise
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd, out)
    return subprocess.CompletedProcess(cmd, proc.returncode, out)
