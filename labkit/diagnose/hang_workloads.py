"""Seeded hangs on live ranks, for hang diagnosis from Flight Recorder dumps (chapter 27).

:func:`hang_job` is a rank target for :func:`labkit.launch`: ``steps`` training-like steps, each a
"data loader" fetch, a little compute, then one all-reduce of the gradient (``numel`` float32 values)
on a process group of its own (``group_desc="hang_demo"``) whose timeout is ``timeout_s`` — short, so a
hang surfaces in seconds as gloo's timeout error in the ranks that wait. One rank (``rank``) goes
wrong at step ``step`` (counted from 1) in the way ``kind`` names:

- ``"none"``: nothing goes wrong (a clean job, which a diagnosis must not call hung);
- ``"skip"``: the rank skips that step's all-reduce, then waits at the job's end for the others
  (a barrier on the world group) — one collective fewer than its peers on ``hang_demo``;
- ``"size"``: the rank all-reduces a gradient of ``numel + 1`` values at that step (a size mismatch);
- ``"loader"``: the rank's data loader stalls for ``stall_s`` seconds before that step's all-reduce;
- ``"exit"``: the rank leaves the job (``sys.exit(3)``) before that step's all-reduce.

Launch it with the Flight Recorder armed (``labkit.launch(..., flight_recorder=DIR)``) and read the
dumps with :func:`labkit.diagnose.hang.diagnose_hang`.
"""
from __future__ import annotations

import datetime as _dt
import sys
import time

from labkit import checks

__all__ = ["HANG_KINDS", "hang_job"]

HANG_KINDS = ("none", "skip", "size", "loader", "exit")


def hang_job(kind: str = "none", rank: int = 2, step: int = 3, *, steps: int = 4, numel: int = 256,
             timeout_s: float = 3.0, stall_s: float = 30.0) -> dict:
    """One rank of a job with a seeded hang (module docstring); returns how many all-reduces it issued.

    Runs inside :func:`labkit.launch` (torch.distributed initialised). Taught in chapter 27 (reading a
    hung job's Flight Recorder dumps)."""
    if kind not in HANG_KINDS:
        raise ValueError(f"kind={kind!r} is not a hang kind; choose one of {HANG_KINDS}")
    checks.count("steps", steps)
    checks.count("numel", numel)
    timeout_s = checks.number("timeout_s", timeout_s, low=0, low_open=True)
    stall_s = checks.number("stall_s", stall_s, low=0)
    import torch
    import torch.distributed as dist

    me, world = dist.get_rank(), dist.get_world_size()
    checks.count("step", step)
    if step > steps:
        raise ValueError(f"step={step} is past the job's last step (steps={steps})")
    if not 0 <= rank < world:
        raise ValueError(f"rank={rank} is not a rank of this job (0..{world - 1})")
    group = dist.new_group(timeout=_dt.timedelta(seconds=timeout_s), group_desc="hang_demo")
    faulty = kind != "none" and me == rank
    issued = 0
    weights = torch.randn(numel, generator=torch.Generator().manual_seed(me))
    for s in range(1, steps + 1):
        if faulty and s == step and kind == "loader":
            time.sleep(stall_s)                    # the data loader of this rank stalls
        batch = torch.randn(numel, generator=torch.Generator().manual_seed(1000 * s + me))
        grad = (weights * batch).tanh()
        if faulty and s == step:
            if kind == "exit":
                sys.exit(3)                        # the rank leaves the job
            if kind == "skip":
                continue                           # no all-reduce this step
            if kind == "size":
                grad = torch.cat([grad, grad[:1]])  # one value too many
        dist.all_reduce(grad, group=group)
        issued += 1
        weights -= 0.01 * grad[:numel] / world
    dist.barrier()                                 # the job's end, on the world group
    return {"rank": me, "all_reduces": issued}
