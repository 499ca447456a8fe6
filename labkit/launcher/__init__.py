"""Run a function on N ranks from a notebook cell, a script or the CLI — and get results back.

``launch(target, nprocs)`` starts ``nprocs`` **fresh** Python processes (``python -m labkit.launcher``;
the notebook kernel is never forked: forking a kernel that has run a matmul deadlocks, and a function
defined in a notebook cannot be pickled into a spawned process), initialises ``torch.distributed`` in
each (NCCL when there is one GPU per rank, gloo on CPU), runs the target and pickles each rank's return
value back through a result file. Rank output is streamed line by line with a ``[rank N]`` prefix
(reader threads; whole lines only, never interleaved mid-line) and kept in per-rank log files.

Failure handling (what ``torchrun`` and ``accelerate.notebook_launcher`` leave to you):

- a rank that raises, exits or is killed → the other ranks (which would block forever in their next
  collective) are stopped and :class:`LaunchError` names the failing rank with its traceback;
- a hang past ``timeout_s`` → every rank dumps its Python stack (``faulthandler`` on SIGUSR1); the rank
  that is *not* waiting inside ``torch.distributed`` is named as the suspect;
- the notebook's stop button (``KeyboardInterrupt`` in the launching process) → the whole process tree
  is stopped.

Limits and teardown (nothing outlives a launch):

- at most ``max(8, 4 × cores)`` CPU ranks (one per GPU with NCCL) unless ``max_nprocs=`` or the
  environment variable ``LABKIT_MAX_NPROCS`` says otherwise — checked before anything starts;
- ranks are supervised from the first one started: a rank that fails while the others are still being
  started stops the starting;
- every rank carries ``LABKIT_LAUNCH_ID=<launch id>`` in its environment, and so does everything it
  starts. Stopping means SIGTERM to each rank's process group (every rank runs in its own session, so
  its DataLoader workers go too) and to every marked process, SIGKILL after a grace period, then
  SIGKILL to every process on the system still carrying the marker — children that ``setsid`` into a
  session of their own too (:mod:`~labkit.launcher.sweep`) — and reaping with ``wait4`` (which also
  gives each rank's peak RSS). Ranks die with the launcher (``PR_SET_PDEATHSIG`` on Linux, a parent
  watchdog elsewhere); what they started in other sessions is swept by the next launch.
- every failure on the rank side — a rank that raises, dies, cannot start, or returns a value that
  cannot be pickled or unpickled — is a :class:`LaunchError`; bad arguments (``timeout_s`` not finite,
  ``log_dir`` an existing file, too many ranks) are ValueError/TypeError before anything starts. Rendezvous: the launcher hosts a ``TCPStore`` on 127.0.0.1 with port 0 (the kernel picks
a free port — no race between choosing and binding) and the ranks join it as clients exactly as under
``torchrun`` (``TORCHELASTIC_USE_AGENT_STORE``), so the same target also runs under plain torchrun::

    torchrun --standalone --nproc_per_node=4 -m labkit run --parallel ddp   # CLI form of labkit.train.run

(``--standalone`` picks a free rendezvous port; ``--master_port=0`` is handed to the workers as port 0.)

Environment per rank, as torchrun sets it: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT``; plus ``OMP_NUM_THREADS = cores //
nprocs`` (≥ 1) so ranks do not fight over cores, and ``GLOO_SOCKET_IFNAME`` = the loopback interface.

Files: :mod:`~labkit.launcher.parent` (:func:`launch`: target, backend, environment, rendezvous),
:mod:`~labkit.launcher.supervise` (the running ranks: streaming, failure, hang and teardown),
:mod:`~labkit.launcher.sweep` (finding and killing every process carrying a launch's marker),
:mod:`~labkit.launcher.results` (:class:`LaunchResult`, :class:`RankResult`, :class:`LaunchError`),
:mod:`~labkit.launcher.flight` (``flight_recorder=DIR``: PyTorch's Flight Recorder armed in every rank,
each rank's record dumped into DIR when it ends, fails, or the launch hangs — chapter 27),
:mod:`~labkit.launcher.worker` (the rank side: :func:`init_distributed`, :func:`whoami`,
:func:`shutdown_distributed`), :mod:`~labkit.launcher.magic` (the ``%%launch`` cell magic), and
``__main__`` (what ``python -m labkit.launcher`` runs in each rank).

Taught in chapter 5 (scaling: running N ranks), chapter 19 (DDP) and chapter 20 (FSDP).
Linux and macOS (process groups and ``wait4``); not Windows.
"""
from __future__ import annotations

from labkit.launcher.magic import load_ipython_extension
from labkit.launcher.parent import BACKENDS, MAX_NPROCS_ENV, cores_available, launch, max_nprocs_default
from labkit.launcher.results import LaunchError, LaunchResult, RankResult
from labkit.launcher.supervise import GRACE_S
from labkit.launcher.worker import init_distributed, shutdown_distributed, whoami

__all__ = ["launch", "LaunchError", "LaunchResult", "RankResult", "init_distributed", "whoami",
           "shutdown_distributed", "cores_available", "max_nprocs_default", "load_ipython_extension",
           "BACKENDS", "GRACE_S", "MAX_NPROCS_ENV"]
