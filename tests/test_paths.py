"""labkit.paths.scratch_dir: a notebook run's scratch folder is gone when its process or kernel exits."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import papermill
import pytest

from labkit.paths import remove_scratch, scratch_dir


def test_scratch_dir_is_removed_when_the_process_exits(tmp_path):
    code = ("from labkit.paths import scratch_dir\n"
            "p = scratch_dir('ch27-')\n"
            "(p / 'sub').mkdir(); (p / 'sub' / 'trace.json').write_text('{}')\n"
            "print(p)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path), "PYTHONPATH": ":".join(sys.path)})
    made = Path(r.stdout.strip())
    assert r.returncode == 0, r.stderr
    assert made.parent == tmp_path and made.name.startswith("ch27-")
    assert not made.exists()


def test_scratch_dir_is_removed_when_a_kernel_shuts_down(tmp_path):
    """papermill shuts its kernel down at the end, as JupyterLab does on close: the folder goes with it."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(f"import tempfile\ntempfile.tempdir = {str(tmp_path)!r}\n"
                                          "from labkit.paths import scratch_dir\n"
                                          "p = scratch_dir('lab10-q3-')\n(p / 'x').write_text('x')\nprint(p)")]
    src, out = tmp_path / "in.ipynb", tmp_path / "out.ipynb"
    nbformat.write(nb, src)
    papermill.execute_notebook(str(src), str(out), kernel_name="python3", progress_bar=False, log_output=False)
    made = Path(nbformat.read(out, as_version=4).cells[0].outputs[0]["text"].strip())
    assert made.parent == tmp_path and made.name.startswith("lab10-q3-")
    assert not made.exists()


def test_folders_of_a_killed_process_are_removed_by_the_next_call(tmp_path, monkeypatch):
    """A kernel killed outright (nbval's SIGKILL) runs no exit handler: the next scratch_dir removes its folder,
    and nothing that is not a dead process's own, in this pid namespace."""
    import os
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    here = os.readlink("/proc/self/ns/pid")

    def folder(name, owner):
        d = tmp_path / name
        (d / "work" / "work").mkdir(parents=True)
        if owner is not None:
            (d / ".labkit-scratch-owner").write_text(owner)
        return d

    dead = folder("ch27-dead", f"{gone.pid} {here}")
    (dead / "work" / "work").chmod(0)                                # as overlayfs leaves it
    live = folder("ch27-live", f"{os.getpid()} {here}")
    elsewhere = folder("ch27-other-ns", f"{gone.pid} pid:[1]")      # a pid of another namespace means nothing here
    foreign = folder("ch27-not-ours", None)
    other_prefix = folder("ch24_dead", f"{gone.pid} {here}")
    new = scratch_dir("ch27-")
    assert not dead.exists() and not other_prefix.exists()          # any prefix: the process is gone
    assert live.exists() and elsewhere.exists() and foreign.exists() and new.is_dir()
    assert (new / ".labkit-scratch-owner").read_text().split() == [str(os.getpid()), here]
    remove_scratch(new)
    remove_scratch(new)                                             # already gone: not an error
    assert not new.exists()


@pytest.mark.parametrize("bad", ["", "a/b", "../x", 3, "x" * 41])
def test_scratch_dir_refuses_a_bad_prefix(bad):
    with pytest.raises(ValueError, match="prefix"):
        scratch_dir(bad)


def test_scratch_block_removes_its_folder_however_it_ends(tmp_path, monkeypatch):
    import tempfile

    from labkit.paths import scratch

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with scratch("labkit-analyze-") as d:
        (d / "rank-0.npz").write_bytes(b"x")
    assert not d.exists()
    with pytest.raises(RuntimeError, match="mid-way"):
        with scratch("labkit-analyze-") as d2:
            raise RuntimeError("mid-way")
    assert not d2.exists() and list(tmp_path.iterdir()) == []


def test_an_nbval_run_leaves_no_scratch_folder_of_the_kernel_it_killed(tmp_path):
    """nbval stops its kernel with SIGKILL (no atexit in the kernel): the plugin make test loads sweeps after it."""
    from labkit.teaching import notebooks

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("from labkit.paths import scratch_dir\n"
                                          "p = scratch_dir('ch27-')\n(p / 'x').write_text('x')\nprint(p.name)")]
    src = tmp_path / "nb.ipynb"
    nbformat.write(nb, src)
    env = {**__import__("os").environ, "TMPDIR": str(tmp_path / "t")}
    (tmp_path / "t").mkdir()
    r = subprocess.run(notebooks.nbval_command(src, cell_timeout_s=120), capture_output=True, text=True,
                       timeout=300, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:]
    assert list((tmp_path / "t").glob("ch27-*")) == []
