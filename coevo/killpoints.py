"""Crash-test hook: `COEVO_TEST_KILL_AT=<point>` SIGKILLs the process at the named point.

The loop and the gate call `kill_point(name)` at the places a crash must be survivable (after
the RL stage, after proposals, after each gate evaluation, ...); tests/test_resume.py kills a
run there, resumes it and compares every stored row with an uninterrupted run's. A no-op unless
the variable names this point.
"""

from __future__ import annotations

import os
import signal

KILL_ENV = "COEVO_TEST_KILL_AT"


def kill_point(name: str) -> None:
    """SIGKILL this process when COEVO_TEST_KILL_AT names this point."""
    if os.environ.get(KILL_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
