"""Chapter 27 under real torchrun: an elastic restart after a rank dies mid-run (resumed from the last
checkpoint, steps lost counted), and two "nodes" (two torchrun agents) meeting at a c10d rendezvous on
localhost. Every torchrun runs in its own process group, killed whole if anything goes wrong."""
import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.record import RunRecord

ROOT = Path(__file__).resolve().parents[1]
RUN = ["-m", "labkit", "run", "--parallel", "ddp", "--warmup-steps", "1", "--micro-batch", "4",
       "--peak-flops", "1e12"]


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LABKIT_RUN_DIR", "TORCHELASTIC"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _torchruns(*argvs):
    """Start one torchrun per argv (own session each); on exit every group still alive is SIGKILLed."""
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *argv], cwd=ROOT, env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for argv in argvs]
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def _finish(procs, timeout=150) -> list:
    return [p.communicate(timeout=timeout)[0] for p in procs]


@pytest.mark.slow
def test_elastic_restart_resumes_from_the_last_checkpoint(tmp_path):
    """torchrun --max-restarts=1: rank 1 dies at the start of step 3 (os._exit, first time only); the agent
    restarts both workers, which resume from step 2 and complete all 6 steps; 1 step is lost. (The restarted
    ranks meet under a per-attempt store prefix: labkit.launcher.worker, pytorch/pytorch#167288.)"""
    ck, out = tmp_path / "ck", tmp_path / "rec.json"
    argv = ["--standalone", "--nnodes=1", "--nproc-per-node=2", "--max-restarts=1", *RUN, "--steps", "6",
            "--checkpoint-every", "2", "--checkpoint-dir", str(ck), "--resume-from", "latest",
            "--fail-at-step", "3", "--fail-rank", "1", "--save", str(out)]
    with _torchruns(argv) as procs:
        (text,) = _finish(procs)
        assert procs[0].returncode == 0, text[-3000:]
    assert "exitcode: 13" in text                       # the injected failure really killed a worker
    rec = RunRecord.load(out)
    c = rec.extra["checkpoint"]
    assert c["restart_count"] == 1 and c["resumed_from"]["step"] == 2
    assert c["steps_lost"] == 1 and c["steps_run"] == 4 and len(rec.loss) == 4
    assert [s["step"] for s in c["saves"]] == [4, 6]
    assert sorted(p.name for p in ck.glob("step_*")) == ["step_0000002", "step_0000004", "step_0000006"]


@pytest.mark.slow
def test_two_nodes_meet_at_a_c10d_rendezvous_on_localhost(tmp_path):
    """Two torchrun agents (--nnodes=2, one rank each) rendezvous at 127.0.0.1:PORT and train one DDP job:
    both ranks' records say world size 2 and hold the same (all-reduced) losses."""
    port = _free_port()
    argv = ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
            "--rdzv-id=labkit-ch27", *RUN, "--steps", "3", "--save", str(tmp_path / "rank{rank}.json")]
    with _torchruns(argv, argv) as procs:
        texts = _finish(procs)
        assert [p.returncode for p in procs] == [0, 0], "\n".join(t[-2000:] for t in texts)
    recs = [RunRecord.load(tmp_path / f"rank{r}.json") for r in (0, 1)]
    assert [r.extra["rank"] for r in recs] == [0, 1]
    assert [r.n_devices for r in recs] == [2, 2] and recs[0].device["backend"] == "gloo"
    assert recs[0].loss == recs[1].loss and len(recs[0].loss) == 3
