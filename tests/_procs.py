"""Stopping a server a test started (JupyterLab, JupyterHub) with everything below it, so no process or port
outlives the test: SIGTERM to its process group (the server shuts its kernels or learners' servers down), a grace
period, then SIGKILL to the group and to the pids that left it (a hub's proxy, servers started under other uids)."""
from __future__ import annotations

import os
import signal
import subprocess


def stop_group(proc: subprocess.Popen, *, grace_s: float = 20, also=(), term_leader_only: bool = False) -> None:
    """Stop ``proc`` (started with ``start_new_session=True``: it leads its process group) and ``also``.
    ``term_leader_only``: the polite SIGTERM goes to ``proc`` alone (a hub stops its own proxy and servers)."""
    if proc.poll() is None:
        try:
            if term_leader_only:
                proc.send_signal(signal.SIGTERM)
            else:
                os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    for pid in also:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)
