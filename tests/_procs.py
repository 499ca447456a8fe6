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


def torchrun_labkit(nproc: int, args: list, *, timeout_s: float = 180) -> tuple[int, str]:
    """``labkit run ARGS`` as the ``nproc`` ranks of a plain torchrun job (no labkit.launch), from the repository
    root with one thread per rank; returns (exit code, output). ``--standalone`` takes a free rendezvous port
    (``--master_port=0`` is passed to the workers as port 0 and hangs). An interrupted torchrun leaves its
    workers: the whole group is stopped."""
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if not k.startswith(("LABKIT_RUN_DIR", "TORCHELASTIC"))}
    env["OMP_NUM_THREADS"] = "1"
    p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          f"--nproc_per_node={nproc}", "-m", "labkit", "run", *map(str, args)],
                         cwd=Path(__file__).resolve().parents[1], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        text, _ = p.communicate(timeout=timeout_s)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return p.returncode, text
