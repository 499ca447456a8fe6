"""labkit.launch with real gloo ranks: results, environment, streaming, failures, cleanup, magic, notebook."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

import labkit
from labkit import launcher
from labkit.launcher import LaunchError, launch, parent

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- rank targets (importable: this module)
def allreduce_rank(scale, *, offset=0):
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    print(f"rank {dist.get_rank()} says hi")
    return {"sum": t.item() * scale + offset, "env": {k: os.environ[k] for k in
            ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")},
            "backend": dist.get_backend()}


def chatty_rank(n_lines, width):
    import torch.distributed as dist

    r = dist.get_rank()
    for i in range(n_lines):
        print(f"<{r}:{i}:" + "x" * width + ">")
    return r


def fail_in_rank_1():
    import torch.distributed as dist

    dist.barrier()
    if dist.get_rank() == 1:
        raise ArithmeticError("injected fault in rank 1")
    dist.barrier()


def return_unpicklable():
    return lambda: 0


def sleep_forever(pid_dir=None):
    import torch.distributed as dist

    if pid_dir:        # a child in a session of its own: out of reach of PDEATHSIG and killpg
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
        Path(pid_dir, f"grandchild{dist.get_rank()}").write_text(str(child.pid))
    dist.barrier()
    print("ready", flush=True)
    time.sleep(3600)


# ---------------------------------------------------------------- helpers
def live_rank_processes() -> list[int]:
    """PIDs of rank processes (python -m labkit.launcher) that are children of this process."""
    me = os.getpid()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == me and "labkit.launcher" in cmd:
            out.append(int(d.name))
    return out


# ---------------------------------------------------------------- tests
def test_values_env_and_logs(tmp_path):
    res = launch(allreduce_rank, 2, args=(10,), kwargs={"offset": 1}, log_dir=tmp_path, stream=False)
    assert [r.exit_code for r in res.ranks] == [0, 0]
    assert [v["sum"] for v in res.values] == [31.0, 31.0]          # (1 + 2) * 10 + 1 on both ranks
    env0, env1 = res.values[0]["env"], res.values[1]["env"]
    assert (env0["RANK"], env1["RANK"], env0["WORLD_SIZE"], env1["LOCAL_RANK"]) == ("0", "1", "2", "1")
    assert env0["MASTER_ADDR"] == "127.0.0.1" and env0["MASTER_PORT"] == env1["MASTER_PORT"]
    assert int(env0["OMP_NUM_THREADS"]) == max(1, launcher.cores_available() // 2)
    assert res.values[0]["backend"] == "gloo"
    assert all(r.peak_rss_bytes and r.peak_rss_bytes > 50 * 2**20 for r in res.ranks)
    assert all(r.wall_s > 0 for r in res.ranks)
    assert "rank 1 says hi" in res.log(1)
    assert res.value is res.values[0]
    assert labkit.launch is launch and labkit.LaunchError is LaunchError


def test_module_string_target_and_whoami():
    res = launch("labkit.launcher:whoami", 2, stream=False, log_dir=False)
    assert sorted(v["rank"] for v in res.values) == [0, 1]
    assert {v["world_size"] for v in res.values} == {2}
    assert len({v["pid"] for v in res.values}) == 2 and os.getpid() not in {v["pid"] for v in res.values}


def test_streams_whole_prefixed_lines(capsys):
    launch(chatty_rank, 2, args=(300, 3000), log_dir=False)   # 2 × 0.9 MB through the pipes
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[rank")]
    assert len(lines) == 600
    for line in lines:
        prefix, body = line.split("] ", 1)
        r = prefix[len("[rank "):]
        assert body.startswith(f"<{r}:") and body.endswith(">") and len(body) == len(body.split(":x")[0]) + 3002


def test_rank0_only(capsys):
    launch(chatty_rank, 2, args=(3, 5), rank0_only=True, log_dir=False)
    out = capsys.readouterr().out
    assert "[rank 0] <0:2:" in out and "[rank 1]" not in out


def test_failure_names_rank_and_traceback(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as ei:
        launch(fail_in_rank_1, 2, timeout_s=60, stream=False, log_dir=tmp_path)
    e = ei.value
    assert e.rank == 1 and e.exit_code == 1 and not e.timed_out
    assert "ArithmeticError: injected fault in rank 1" in e.traceback and "fail_in_rank_1" in e.traceback
    assert "rank 1 failed" in str(e)
    assert time.monotonic() - t0 < 30
    assert live_rank_processes() == []
    assert (tmp_path / "rank1.log").read_text().count("injected fault") >= 1


def test_script_target(tmp_path):
    script = tmp_path / "torchrun_style.py"
    script.write_text(textwrap.dedent("""
        import sys, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.ones(1); dist.all_reduce(t)
        print("script", dist.get_rank(), int(t.item()), sys.argv[1:])
        dist.barrier(); dist.destroy_process_group()
    """))
    res = launch(str(script), 2, args=("--flag", 3), log_dir=tmp_path / "logs", stream=False)
    assert res.values == [None, None]
    assert "script 1 2 ['--flag', '3']" in res.log(1)


def test_unpicklable_return_value_is_an_error():
    with pytest.raises(LaunchError, match="could not be pickled"):
        launch(return_unpicklable, 1, stream=False, log_dir=False)


def test_bad_inputs(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="nprocs=0"):
        launch(allreduce_rank, 0)
    with pytest.raises(ValueError, match="backend='mpi'"):
        launch(allreduce_rank, 1, backend="mpi")
    with pytest.raises(ValueError, match="nccl"):
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count() >= 64:
            pytest.skip("64 GPUs present")
        launch(allreduce_rank, 64, backend="nccl")
    with pytest.raises(TypeError, match="lambda"):
        launch(lambda: 0, 1)
    with pytest.raises(ValueError, match="no such script"):
        launch(str(tmp_path / "missing.py"), 1)
    with pytest.raises(ValueError, match="not importable"):
        launch("no_such_module_xyz:f", 1)
    with pytest.raises(ValueError, match="timeout_s"):
        launch(allreduce_rank, 1, timeout_s=0)

    def in_notebook():
        return 1

    in_notebook.__module__ = "__main__"
    in_notebook.__qualname__ = "in_notebook"
    fake_main = type(sys)("__main__")          # a kernel's __main__ has no __file__
    monkeypatch.setitem(sys.modules, "__main__", fake_main)
    with pytest.raises(TypeError, match="%%launch"):
        launch(in_notebook, 1)


def test_dead_launcher_takes_its_ranks_down(tmp_path, monkeypatch):
    """SIGKILL the launching process: its ranks (own sessions) die with it (PR_SET_PDEATHSIG / watchdog);
    the children they started in sessions of their own are swept by the next launch (their marker)."""
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})
        import labkit
        labkit.launch("test_launcher:sleep_forever", 2, args=({str(tmp_path)!r},), log_dir={str(tmp_path)!r},
                      timeout_s=300)
    """)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            cwd=ROOT, env={**os.environ, "TMPDIR": str(tmp)})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(
            (tmp_path / f"rank{r}.log").exists() and "ready" in (tmp_path / f"rank{r}.log").read_text()
            for r in range(2)):
        time.sleep(0.1)
    pids = _children_of(proc.pid)
    assert len(pids) == 2, f"expected 2 rank processes, found {pids}"
    grandchildren = [int((tmp_path / f"grandchild{r}").read_text()) for r in range(2)]
    try:
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.05)
        assert not any(_alive(p) for p in pids)
        assert all(_alive(p) for p in grandchildren)       # out of reach of PDEATHSIG: only the marker finds them
        # the dead launcher could not remove its run folder; the next launch sweeps it, and the processes
        # carrying its marker
        assert len(list(tmp.glob("labkit-launch-*"))) == 1
        monkeypatch.setattr(tempfile, "tempdir", str(tmp))
        launch("labkit.launcher:whoami", 1, stream=False, log_dir=False)
        assert list(tmp.glob("labkit-launch-*")) == []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_alive(p) for p in grandchildren):
            time.sleep(0.05)
        assert not any(_alive(p) for p in grandchildren)
    finally:
        for p in grandchildren:
            with contextlib.suppress(OSError):
                if _alive(p) and b"LABKIT_LAUNCH_ID=" in Path(f"/proc/{p}/environ").read_bytes():
                    os.kill(p, 9)


def _children_of(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, ValueError, IndexError):
                pass
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_cell_magic(capsys):
    registered = {}

    class FakeShell:
        def register_magic_function(self, fn, magic_kind, magic_name):
            registered[(magic_kind, magic_name)] = fn

    launcher.load_ipython_extension(FakeShell())
    magic = registered[("cell", "launch")]
    res = magic("-n 2 --timeout 60", "import torch.distributed as dist\nprint('cell on', dist.get_rank())\n"
                                     "result = dist.get_world_size() * 10 + dist.get_rank()\n")
    assert res.values == [20, 21]
    assert "[rank 1] cell on 1" in capsys.readouterr().out
    with pytest.raises(ValueError, match="usage"):
        magic("-n two", "pass")


@pytest.mark.notebook
def test_launch_from_a_jupyter_kernel(tmp_path):
    """A real kernel that has run a matmul launches 2 ranks (function and %%launch); no fork deadlock."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    cells = [
        "import sys, torch\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "x = torch.randn(256, 256); y = x @ x   # the kernel has touched torch's thread pool",
        "import labkit\nres = labkit.launch('test_launcher:allreduce_rank', 2, args=(1,), log_dir=False)\n"
        "assert [v['sum'] for v in res.values] == [3.0, 3.0]",
        "%load_ext labkit.launcher",
        "%%launch -n 2 --timeout 60\nimport torch.distributed as dist\nresult = dist.get_rank()",
        "assert _.values == [0, 1]\nprint('NOTEBOOK OK')",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outs = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert "NOTEBOOK OK" in outs
    assert "[rank 1] " in outs          # rank output was streamed into the cell


def test_cli_launch(tmp_path, capsys):
    from labkit.cli import main

    assert main(["launch", "-n", "2", "--log-dir", str(tmp_path), "labkit.launcher:whoami"]) == 0
    assert "LaunchResult(2 ranks" in capsys.readouterr().out
    assert main(["launch", "-n", "2", "--log-dir", str(tmp_path), "test_launcher:fail_in_rank_1"]) == 1
    assert "injected fault in rank 1" in capsys.readouterr().err


def spawn_grandchild_then_fail(pid_dir):
    import torch.distributed as dist

    child = subprocess.Popen(["sleep", "300"])          # like a DataLoader worker: same process group
    Path(pid_dir, f"child{dist.get_rank()}").write_text(str(child.pid))
    dist.barrier()
    if dist.get_rank() == 1:
        raise RuntimeError("fault with a live child")
    time.sleep(300)


def test_stopping_a_rank_stops_its_children(tmp_path):
    """The failed rank's and the stopped rank's own children (process group) are gone afterwards."""
    with pytest.raises(LaunchError) as ei:
        launch(spawn_grandchild_then_fail, 2, args=(str(tmp_path),), stream=False, log_dir=False, timeout_s=60)
    assert ei.value.rank == 1
    pids = [int((tmp_path / f"child{r}").read_text()) for r in range(2)]
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)


def test_backend_choice_with_fake_gpus(monkeypatch):
    """The thin CUDA branch: NCCL only when every rank gets a GPU (fake torch.cuda, no GPU needed)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert parent._choose_backend("auto", 2) == "nccl"
    assert parent._choose_backend("auto", 4) == "gloo"
    assert parent._choose_backend("gloo", 2) == "gloo"
    with pytest.raises(ValueError, match="nprocs=4 but 2 GPU"):
        parent._choose_backend("nccl", 4)


def test_the_sweep_leaves_folders_of_launchers_in_another_pid_namespace(tmp_path, monkeypatch):
    """A launcher's folder is named by its pid, which means something only in its own PID namespace: a
    launcher in another one (a graded submission in a namespace of its own) must not take a live launch's
    folder for a dead one. Only a folder of this namespace whose launcher is gone is swept."""
    from labkit.launcher import sweep

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()                                       # a pid no process holds now (in this namespace)
    mine = sweep.pid_namespace()
    here = tmp_path / f"labkit-launch-{dead.pid}-here"
    other = tmp_path / f"labkit-launch-{dead.pid}-other"
    legacy = tmp_path / f"labkit-launch-{dead.pid}-legacy"
    for d, ns in ((here, mine), (other, "pid:[1]"), (legacy, None)):
        d.mkdir()
        (d / "launch_id").write_text("none-such")
        if ns is not None:
            (d / "pidns").write_text(ns)
    sweep.sweep_stale_run_dirs()
    assert not here.exists()
    assert other.exists() and legacy.exists()        # another namespace; an unmarked folder under an hour old
