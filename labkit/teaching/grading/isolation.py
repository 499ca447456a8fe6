"""A submission's processes in a cage: their own PID namespace, and the instructor's files behind an overlay.

``labkit grade`` starts each submission's executor as the first process (PID 1) of a new PID and mount
namespace (``unshare(1)``: ``--pid --fork --mount-proc --kill-child``; as root directly, otherwise inside a
user namespace, ``--user --map-root-user``). Before the executor starts, this file, run as a script
(:func:`enter`, standard library only), mounts in that namespace only

- an **overlay** (``overlayfs``: lower = the real folder, upper = a scratch folder of the grader's) over every
  protected folder — the course checkout, the labkit package, the lab's folder, the grading output (the
  gradebook, everyone's feedback), the Python environment. A submission may write, delete or rename there as it
  likes: every change lands in the scratch folder, never on disk, and :meth:`Cage.touched` names it afterwards
  (a deletion is a whiteout, a 0/0 character device, ``Documentation/filesystems/overlayfs.rst``);
- its own work folders bound back on top (writable, for real: the evidence the checks read);
- an empty tmpfs over the scratch folder, so the submission cannot reach the upper layers to erase its traces;

then drops every capability (bounding, inheritable and ambient sets; ``no_new_privs``; ``capabilities(7)``)
so that nothing in the cage can unmount the overlay, and ``exec``s the executor. In the new PID namespace the
grader is not there to be signalled (``pid_namespaces(7)``): a ``kill`` of its PID reaches nothing, and the
executor, being the namespace's init, gets only the signals it handles — which it records as tampering.
When the executor ends, the kernel kills everything left in the namespace; when the grader dies,
``--kill-child`` takes the namespace down.

:func:`isolation` probes once per process whether this works here (it does as root, and for a user where
unprivileged user namespaces and overlayfs are allowed, Linux ≥ 5.11); where it does not, the grader runs
submissions as before — integrity-checked before and after, not walled off — and says so.

Taught in the instructor notes of the labs (``labs/README.md``, ``labkit grade --help``).
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

ENTER_FAILED = 97           # the cage could not be built: a grader-side failure, never the submission's
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC = 2, 4, 4096, 16384
_PROBE: dict = {}


def _unshare(user_ns: bool) -> list[str]:
    return [shutil.which("unshare") or "unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
            "--propagation", "private", *(["--user", "--map-root-user"] if user_ns else [])]


class Cage:
    """The overlays and writable folders of one submission's run; ``scratch`` holds the overlays' upper layers."""

    def __init__(self, protect, rw, scratch):
        rw = [Path(p).resolve() for p in rw]
        roots = sorted({Path(p).resolve() for p in protect if Path(p).exists()}, key=lambda p: len(p.parts))
        self.protect = [p for i, p in enumerate(roots) if p.is_dir() and not any(q in p.parents for q in roots[:i])]
        self.rw, self.scratch = rw, Path(scratch)

    def layers(self) -> list[tuple[str, str, str]]:
        return [(str(p), str(self.scratch / str(i) / "upper"), str(self.scratch / str(i) / "work"))
                for i, p in enumerate(self.protect)]

    def command(self, prefix: list[str], cmd: list[str], cwd) -> list[str]:
        """``prefix`` (the unshare command) + this file as PID 1, which mounts the cage and execs ``cmd``."""
        for _, upper, work in self.layers():
            os.makedirs(upper)
            os.makedirs(work)
        spec = self.scratch / "cage.json"
        spec.write_text(json.dumps({"layers": self.layers(), "rw": [str(p) for p in self.rw], "cmd": cmd,
                                    "cwd": str(cwd), "hide": str(self.scratch)}))
        return [*prefix, sys.executable, "-I", str(Path(__file__).resolve()), str(spec)]

    def touched(self) -> list[str]:
        """What the run wrote, deleted or renamed in the protected folders (seen in the upper layers)."""
        found = []
        for lower, upper, _ in self.layers():
            for root, dirs, files in os.walk(upper):
                dirs[:] = [d for d in dirs if d != "__pycache__"]
                for name in files + [d for d in dirs if not (Path(lower) / Path(root, d).relative_to(upper)).exists()]:
                    rel = Path(root, name).relative_to(upper)
                    real = Path(lower) / rel
                    st = os.lstat(Path(root, name))
                    if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                        found.append(f"deleted or renamed {real}")
                    else:
                        found.append(f"{'changed' if real.exists() else 'created'} {real}")
        return sorted(found)

    def finish(self) -> list[str]:
        """:meth:`touched`, then :meth:`remove`: what the run changed, and no scratch layer left behind."""
        try:
            return self.touched()
        finally:
            self.remove()

    def remove(self) -> None:
        from labkit.paths import remove_scratch  # not at the top: this file runs as a standard-library script

        remove_scratch(self.scratch)


def scratch_dir() -> Path:
    """A new scratch folder for one cage's upper layers (``labkit-cage-…`` in the temporary folder). A grader
    killed by SIGKILL cannot remove its own: those of a grader that is gone are removed when the next is made
    (:func:`labkit.paths.scratch_dir`), so a resumed batch leaves none behind."""
    from labkit import paths

    return paths.scratch_dir("labkit-cage-", at_exit=False)


def probe(user_ns: bool) -> str:
    """Build a real cage (``--user --map-root-user`` when ``user_ns``) around a throwaway folder: "" when a
    write through the overlay landed in the scratch layer only, a deletion left the file on disk, a write to
    the bound-back folder reached the disk, and the caged process was PID 1 with no capabilities; else why not."""
    with tempfile.TemporaryDirectory(prefix="labkit-cage-probe-") as t:
        lower, keep = Path(t, "lower"), Path(t, "lower", "keep")
        keep.mkdir(parents=True)
        (lower / "old").write_text("x")
        cage = Cage([lower], [keep], Path(t, "scratch"))
        code = ("import os; open('new', 'w').write('x'); os.remove('old'); open('keep/y', 'w').write('y')"
                "; caps = [l for l in open('/proc/self/status') if l.startswith('CapEff')][0]"
                "; print(os.getpid(), int(caps.split()[1], 16))")
        try:
            r = subprocess.run(cage.command(_unshare(user_ns), [sys.executable, "-c", code], lower),
                               capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
            if (r.returncode == 0 and r.stdout.split() == ["1", "0"] and (lower / "old").exists()
                    and not (lower / "new").exists() and (keep / "y").exists()
                    and cage.touched() == [f"created {lower / 'new'}", f"deleted or renamed {lower / 'old'}"]):
                return ""
            return (r.stderr.strip().splitlines() or [f"exit {r.returncode}, output {r.stdout.strip()!r}"])[-1][:200]
        except (OSError, subprocess.SubprocessError) as e:
            return f"{type(e).__name__}: {e}"
        finally:
            cage.remove()


def isolation() -> tuple[list[str] | None, str]:
    """(the unshare command prefix, or None where submissions cannot be caged here; a one-line note why),
    found by :func:`probe` once per process: as root without a user namespace, then with one."""
    if "result" in _PROBE:
        return _PROBE["result"]
    why = "unshare(1) not found" if not shutil.which("unshare") else "not Linux"
    if sys.platform.startswith("linux") and shutil.which("unshare"):
        for user_ns in ([False, True] if os.geteuid() == 0 else [True]):
            why = probe(user_ns)
            if not why:
                mode = "in a user namespace" if user_ns else "as root"
                _PROBE["result"] = (_unshare(user_ns), f"submissions caged ({mode}): own PID namespace, the "
                                    "instructor's files behind an overlay, no capabilities")
                return _PROBE["result"]
    _PROBE["result"] = (None, f"submissions NOT caged ({why}): the instructor's files are integrity-checked "
                              "before and after each run, but not walled off; run the grader as a user the "
                              "submissions cannot write for")
    return _PROBE["result"]


def _drop_privileges(libc) -> None:
    """No capability survives the exec: bounding set emptied (PR_CAPBSET_DROP), ambient cleared, inheritable
    zeroed (capset), no_new_privs set (``prctl(2)``, ``capabilities(7)``)."""
    for cap in range(64):
        libc.prctl(24, cap, 0, 0, 0)                 # PR_CAPBSET_DROP; EINVAL past the last capability
    libc.prctl(47, 4, 0, 0, 0)                       # PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    hdr, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3
    if libc.capget(ctypes.byref(hdr), data) == 0:
        data[0].inheritable = data[1].inheritable = 0
        libc.capset(ctypes.byref(hdr), data)
    if libc.prctl(38, 1, 0, 0, 0) != 0:             # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")


def enter(spec_path: str) -> int:
    """PID 1 of the cage: mount the overlays, bind the writable folders back, drop privileges, exec."""
    spec = json.loads(Path(spec_path).read_text())
    libc = ctypes.CDLL(None, use_errno=True)

    def mount(src, target, fstype, flags, data):
        args = [x.encode() if isinstance(x, str) else x for x in (src, target, fstype)]
        if libc.mount(*args, ctypes.c_ulong(flags), data.encode() if data else None) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"mount {fstype or 'bind'} on {target}: {os.strerror(e)}")

    try:
        keep = [(p, os.open(p, os.O_PATH | os.O_DIRECTORY)) for p in spec["rw"]]   # the real folders, before
        for layer in spec["layers"]:   # each folder by an open descriptor: a ',' or ':' in a path cannot matter
            fds = [os.open(p, os.O_PATH | os.O_DIRECTORY) for p in layer]
            lower, upper, work = (f"/proc/self/fd/{fd}" for fd in fds)
            mount("overlay", layer[0], "overlay", 0, f"lowerdir={lower},upperdir={upper},workdir={work}")
            for fd in fds:
                os.close(fd)
        for p, fd in keep:
            mount(f"/proc/self/fd/{fd}", p, None, MS_BIND | MS_REC, None)
            os.close(fd)
        # the upper layers out of the submission's reach (it could otherwise erase its traces there)
        mount("tmpfs", spec["hide"], "tmpfs", MS_NOSUID | MS_NODEV, "size=4k,mode=000")
        _drop_privileges(libc)
        os.chdir(spec["cwd"])
        os.execv(spec["cmd"][0], spec["cmd"])
    except OSError as e:
        print(f"labkit grader: the submission's cage could not be built: {e}", file=sys.stderr, flush=True)
        return ENTER_FAILED
    return ENTER_FAILED


if __name__ == "__main__":
    sys.exit(enter(sys.argv[1]))
