"""What a job's NCCL / EFA environment really does, variable by variable (``labkit comm env``).

Training scripts carry environment templates copied from post to post (``-x NCCL_ALGO=Tree -x
NCCL_SOCKET_IFNAME=efa …``). Each variable is read by one component, or by none: NCCL, libfabric's EFA
provider, the aws-ofi-nccl plugin, rdma-core. :func:`check_env` takes a job's environment (a mapping, the
process's own, or pasted text: ``export X=Y``, ``X=Y``, mpirun's ``-x X=Y`` / ``-x X``, Slurm's
``--export=X=Y,…``) and says for each variable: whether it exists (for NCCL: whether NCCL's own source reads
it, :mod:`labkit.comm.nccl_env_names`), which component reads it, what it does, its default, whether NCCL's
docs put it under *Debugging* ("should not be used in production nor retained in scripts"), and a verdict
with the page it cites. :data:`SOURCE_TEMPLATE` is the course source's NCCL/EFA template.

Verdicts: ``ok`` (real and sensible), ``debugging only`` (real, for a diagnosis, not a standing setting),
``not needed`` (real, but current software does it already), ``no effect`` (nothing reads it: silently
ignored), ``harmful`` (breaks the job or slows it), ``unknown`` (not in labkit's table: look it up).

Taught in chapter 23 (communication optimisation).
"""
from __future__ import annotations

import difflib
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from labkit import checks
from labkit.comm.nccl_env_names import NCCL_NAMES, NCCL_SOURCE_COMMIT

__all__ = ["EnvFinding", "SOURCE_TEMPLATE", "VERDICTS", "check_env", "parse_env_text", "report", "PREFIXES"]

VERDICTS = ("harmful", "no effect", "debugging only", "not needed", "unknown", "ok")
PREFIXES = ("NCCL_", "FI_", "OFI_NCCL_", "RDMAV_", "TORCH_NCCL_")   # what check_env(None) reads of os.environ

# The course source's NCCL/EFA template (chapter 23), as checked in the course's facts sheet; None = the
# template names the variable without a value the course quotes (its verdict does not depend on one).
SOURCE_TEMPLATE = (("NCCL_SOCKET_IFNAME", "efa"), ("NCCL_ALGO", "Tree"), ("NCCL_NCHANNELS", None),
                   ("NCCL_BUFFSIZE", "16777216"), ("NCCL_NSOCKS_PERTHREAD", "8"), ("NCCL_THREADS", "64"),
                   ("FI_EFA_USE_DEVICE_RDMA", "1"), ("FI_PROVIDER", "efa"), ("RDMAV_FORK_SAFE", "1"),
                   ("NCCL_IGNORE_CPU_AFFINITY", "1"), ("NCCL_DEBUG", None), ("NCCL_DEBUG_SUBSYS", None))

_NCCL_DOCS = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"
_NCCL_SRC = f"https://github.com/NVIDIA/nccl/tree/{NCCL_SOURCE_COMMIT[:7]}/src"
_OFI = "https://github.com/aws/aws-ofi-nccl/blob/master/doc/efa-env-var.md"
_EFA = "https://ofiwg.github.io/libfabric/main/man/fi_efa.7.html"
_FABRIC = "https://ofiwg.github.io/libfabric/main/man/fabric.7.html"


def _nccl_url(name: str) -> str:
    return f"{_NCCL_DOCS}#{name.lower().replace('_', '-')}"


@dataclass(frozen=True)
class EnvFinding:
    """One variable of a job's environment and what it really does. Taught in chapter 23."""

    name: str
    value: str | None
    exists: bool
    component: str
    what: str
    default: str
    debugging_only: bool
    verdict: str
    advice: str
    url: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class _Var:
    component: str
    what: str
    default: str
    url: str
    debugging_only: bool = False
    exists: bool = True


def _v(name, component, what, default, *, debug=False, url=None, exists=True) -> tuple[str, _Var]:
    return name, _Var(component, what, default, url or _nccl_url(name), debug, exists)


_NCCL = "NCCL"
_TABLE = dict([
    _v("NCCL_SOCKET_IFNAME", _NCCL, "prefix filter over the host's IP interfaces (getifaddrs) for bootstrap and "
       "the socket transport", "every interface but lo and docker*"),
    _v("NCCL_ALGO", _NCCL, "forces the collective algorithms (Ring, Tree, NVLS, CollNet…)", "NCCL's tuner picks",
       debug=True),
    _v("NCCL_PROTO", _NCCL, "forces the protocols (LL, LL128, Simple)", "NCCL's tuner picks", debug=True),
    _v("NCCL_NCHANNELS", _NCCL, "nothing: no code of NCCL reads this name (the channel bounds are NCCL_MIN_CTAS / "
       "NCCL_MAX_CTAS, formerly NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS)", "—", url=_nccl_url("NCCL_MIN_CTAS"),
       exists=False),
    _v("NCCL_THREADS", _NCCL, "nothing: no code of NCCL reads this name (NCCL_NTHREADS is CUDA threads per block; "
       "the socket transport's CPU helper threads are NCCL_SOCKET_NTHREADS)", "—", url=_nccl_url("NCCL_NTHREADS"),
       exists=False),
    _v("NCCL_MIN_NCHANNELS", _NCCL, "lower bound on channels (deprecated in 2.17 for NCCL_MIN_CTAS)", "NCCL picks",
       debug=True),
    _v("NCCL_MAX_NCHANNELS", _NCCL, "upper bound on channels (deprecated in 2.17 for NCCL_MAX_CTAS)", "NCCL picks",
       debug=True),
    _v("NCCL_MIN_CTAS", _NCCL, "lower bound on CTAs (channels) per collective", "NCCL picks", debug=True),
    _v("NCCL_MAX_CTAS", _NCCL, "upper bound on CTAs (channels) per collective", "NCCL picks", debug=True),
    _v("NCCL_BUFFSIZE", _NCCL, "bytes of buffer per channel and peer for the Simple protocol", "4 MiB (4194304); "
       "aws-ofi-nccl sets 8 MiB itself on p4d/p5", debug=True),
    _v("NCCL_NTHREADS", _NCCL, "CUDA threads per block of NCCL's kernels (64–512)", "512", debug=True),
    _v("NCCL_NSOCKS_PERTHREAD", _NCCL, "sockets per helper thread of NCCL's *socket* transport (NET/Socket) only; "
       "NSOCKS_PERTHREAD × SOCKET_NTHREADS ≤ 64", "transport-dependent (AWS ENA: 8)"),
    _v("NCCL_SOCKET_NTHREADS", _NCCL, "CPU helper threads per connection of the socket transport only",
       "transport-dependent"),
    _v("NCCL_IGNORE_CPU_AFFINITY", _NCCL, "ignore the job's CPU affinity and pin NCCL's threads by the GPU's NUMA "
       "node; a per-node CPU pinning choice", "0"),
    _v("NCCL_DEBUG", _NCCL, "log level: VERSION, WARN, INFO, TRACE", "none (WARN is the production minimum)"),
    _v("NCCL_DEBUG_SUBSYS", _NCCL, "which subsystems an INFO log covers (INIT, COLL, NET, GRAPH, TUNING, ENV…)",
       "INIT,BOOTSTRAP,ENV"),
    _v("FI_EFA_USE_DEVICE_RDMA", "libfabric (EFA provider)", "use the EFA device's RDMA (GPUDirect) for transfers",
       "on where the hardware supports it (libfabric ≥ 1.18)", url=_OFI),
    _v("FI_PROVIDER", "libfabric", "restricts libfabric to the named provider", "all providers; aws-ofi-nccl "
       "selects efa itself on EC2", url=_FABRIC),
    _v("RDMAV_FORK_SAFE", "rdma-core (libibverbs)", "makes verbs memory registrations survive fork() with "
       "madvise(DONTFORK)", "unset", url=_OFI),
    _v("FI_EFA_FORK_SAFE", "libfabric (EFA provider)", "fork support of the EFA provider", "set by the plugin itself",
       url=_OFI),
    _v("FI_EFA_USE_HUGE_PAGE", "libfabric (EFA provider)", "huge pages for the provider's bounce buffers", "1",
       url=_EFA),
])


def _judge(name: str, value: str | None) -> tuple[str, str]:
    """(verdict, advice) for a variable labkit's table knows."""
    v = (value or "").strip()
    if name == "NCCL_SOCKET_IFNAME":
        if any(p.lstrip("=^").lower().startswith("efa") for p in v.split(",") if not p.startswith("^")):
            return "harmful", ("EFA is an RDMA device with no IP address (it shows as infiniband efa_0), so no "
                               "interface matches and bootstrap fails ('no socket interface found'; NCCL 2.27.7 "
                               "crashed: github.com/NVIDIA/nccl/issues/1837). Name the ENA/Ethernet interface "
                               "(e.g. ens5) or exclude the wrong ones: ^lo,docker")
        return "ok", "filters IP interfaces for bootstrap and sockets; check the chosen one in an INFO log (NET/Socket)"
    if name == "NCCL_ALGO":
        if v and set(re.split(r"[,;\s]+", v.lower().lstrip("^"))) <= {"tree"} and not v.startswith("^"):
            return "harmful", ("Tree implements AllReduce only; since NCCL 2.24 there is no implicit Ring fallback, "
                               "so AllGather and ReduceScatter fail ('No algorithm/protocol available … NCCL_ALGO "
                               "was set to Tree', src/enqueue.cc) — FSDP and ZeRO stop. Leave it unset; to "
                               "restrict one collective use NCCL's per-collective syntax (e.g. allreduce:tree)")
        return "debugging only", "a Debugging variable: for an experiment, not a standing setting"
    if name in ("NCCL_NCHANNELS", "NCCL_THREADS"):
        if name == "NCCL_NCHANNELS":
            return "no effect", ("silently ignored. The real bounds are NCCL_MIN_CTAS / NCCL_MAX_CTAS, Debugging "
                                 "variables: leave the default (aws-ofi-nccl: p4d needs ≥ 8 channels, which NCCL "
                                 "picks itself; more channels split messages smaller and starve EFA)")
        return "no effect", ("silently ignored. NCCL_NTHREADS (CUDA threads per block, Debugging) and "
                             "NCCL_SOCKET_NTHREADS (socket transport only) are the real names; leave both unset")
    if name == "NCCL_NSOCKS_PERTHREAD":
        return "not needed", ("socket transport only: no effect over EFA or InfiniBand ('not applicable for EFA', "
                              "aws-ofi-nccl); over plain TCP AWS's default is already 8")
    if name == "NCCL_IGNORE_CPU_AFFINITY":
        return "not needed", ("real, but about CPU pinning inside one node (NUMA), nothing to do with availability zones: "
                      "EFA's OS bypass only works inside one subnet. Set it only when the launcher's affinity is wrong")
    if name == "NCCL_DEBUG":
        if v.upper() in ("INFO", "TRACE"):
            return "debugging only", ("INFO/TRACE is for a diagnosis run (it shows transports, channels, algorithms "
                                      "chosen); WARN is the production minimum")
        return "ok", "WARN is the production minimum; INFO for a diagnosis run"
    if name == "NCCL_DEBUG_SUBSYS":
        return "ok", "narrows an INFO log (default INIT,BOOTSTRAP,ENV; add NET,GRAPH,TUNING to see NCCL's choices)"
    if name == "FI_EFA_USE_DEVICE_RDMA":
        return "not needed", ("not needed with libfabric ≥ 1.18 and aws-ofi-nccl ≥ 1.7 (the provider turns RDMA on "
                              "where the device has it); =1 on EFA hardware without RDMA aborts")
    if name == "FI_PROVIDER":
        return "not needed", "the plugin forces the efa provider on EC2; needed only with aws-ofi-nccl ≤ 1.5.0"
    if name == "RDMAV_FORK_SAFE":
        return "harmful", ("aws-ofi-nccl: 'Do not use' — rdma-core's fork mode behaves differently from "
                           "FI_EFA_FORK_SAFE and can break things on newer kernels; the plugin sets what is needed")
    if name == "FI_EFA_FORK_SAFE":
        return "not needed", "the plugin sets it itself (since at least v1.2)"
    if _TABLE[name].debugging_only:
        return "debugging only", "a Debugging variable: NCCL's docs say not to keep it in scripts"
    return "ok", ""


def _finding(name: str, value: str | None) -> EnvFinding:
    if name in _TABLE:
        var = _TABLE[name]
        verdict, advice = _judge(name, value)
        return EnvFinding(name, value, var.exists, var.component, var.what, var.default, var.debugging_only,
                          verdict, advice, var.url)
    if name.startswith("NCCL_"):
        if name in NCCL_NAMES:
            return EnvFinding(name, value, True, _NCCL, "read by NCCL (see its documentation)", "see the docs",
                              False, "ok", "real; labkit has no advice on it", _nccl_url(name))
        close = difflib.get_close_matches(name, sorted(NCCL_NAMES), n=2, cutoff=0.75)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        return EnvFinding(name, value, False, _NCCL, "nothing: no code of NCCL reads this name", "—", False,
                          "no effect", f"silently ignored{hint}", _NCCL_SRC)
    return EnvFinding(name, value, True, "?", "not in labkit's table", "?", False, "unknown",
                      "look it up in the component's documentation", "")


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _pair(token: str) -> tuple[str, str | None] | None:
    name, eq, value = token.partition("=")
    return (name, value if eq else None) if _NAME.match(name) else None


_LOGGED_NAME = re.compile(r"(?:NCCL|FI|OFI_NCCL|RDMAV|TORCH_NCCL)_[A-Z0-9_]+")
_SET_BY = " set by environment to "


def _logged(line: str) -> tuple[str, str] | None:
    """(name, value) of an NCCL INFO ``NCCL_X set by environment to Y.`` line, else None. String
    operations, no backtracking regex: linear in the line (a 120 kB line took 55 s with one ``re.search``)."""
    head, sep, tail = line.partition(_SET_BY)
    if not sep:
        return None
    i = len(head)
    while i and (head[i - 1].isalnum() or head[i - 1] == "_"):    # the word just before (regex \b…)
        i -= 1
    name = head[i:]
    if not _LOGGED_NAME.fullmatch(name):
        return None
    value = tail.rstrip()
    return name, value[:-1] if value.endswith(".") else value


def parse_env_text(text: str) -> list[tuple[str, str | None]]:
    """(name, value) pairs from pasted text: lines of ``X=Y`` or ``export X=Y``, mpirun's ``-x X=Y`` and ``-x X``
    (exported from the caller's environment: value None), Slurm's ``--export=X=Y,Z=W``, and ``NCCL_X set by
    environment to Y`` lines of an NCCL INFO log. Later settings of a name win. Taught in chapter 23."""
    if not isinstance(text, str):
        raise checks.ArgumentTypeError(f"text must be a str, got {type(text).__name__}")
    found: dict[str, str | None] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        too_long = checks.long_line(lineno, line, "settings or NCCL log")
        if too_long:
            raise ValueError(too_long)
        logged = _logged(line)
        if logged:
            found[logged[0]] = logged[1]
            continue
        line = line.split("#", 1)[0].strip().rstrip("\\").strip()
        if not line:
            continue
        try:
            tokens = shlex.split(line)
        except ValueError as e:
            raise ValueError(f"line {lineno}: {e} in {line[:80]!r}") from None
        i = 0
        while i < len(tokens):
            t = tokens[i]
            if t == "-x" and i + 1 < len(tokens):             # Open MPI: -x NAME=VALUE, or -x NAME (exported)
                p = _pair(tokens[i + 1])
                if p:
                    found[p[0]] = p[1]
                i += 2
                continue
            if t == "-genv" and i + 2 < len(tokens) and _NAME.match(tokens[i + 1]):   # MPICH/Intel: -genv N V
                found[tokens[i + 1]] = tokens[i + 2]
                i += 3
                continue
            if t.startswith("--export="):
                for part in t[len("--export="):].split(","):
                    p = _pair(part)
                    if p and p[1] is not None:
                        found[p[0]] = p[1]
            elif "=" in t and not t.startswith("-"):
                p = _pair(t)
                if p:
                    found[p[0]] = p[1]
            i += 1
    return list(found.items())


def check_env(env: Mapping | str | None = None, *, template: bool = False) -> list[EnvFinding]:
    """What each variable of a job's environment does (see the module docstring), worst verdict first.

    ``env``: a mapping (e.g. ``os.environ`` of the job), pasted text (:func:`parse_env_text`), or None for this
    process's environment; only variables that start with one of :data:`PREFIXES` are checked. ``template=True`` checks the course source's
    :data:`SOURCE_TEMPLATE` instead. Taught in chapter 23.
    """
    if checks.flag("template", template):
        if env is not None:
            raise ValueError("check_env: give env or template=True, not both")
        pairs = list(SOURCE_TEMPLATE)
    elif env is None:
        pairs = [(k, v) for k, v in os.environ.items() if k.startswith(PREFIXES)]
    elif isinstance(env, str):
        pairs = [(k, v) for k, v in parse_env_text(env) if k.startswith(PREFIXES)]
    elif isinstance(env, Mapping):
        pairs = []
        for k, v in env.items():
            if not isinstance(k, str) or not _NAME.match(k):
                raise ValueError(f"check_env: {k!r} is not an environment variable name")
            if v is not None and not isinstance(v, str):
                raise checks.ArgumentTypeError(f"check_env: the value of {k} must be a str or None, got {type(v).__name__}")
            if k.startswith(PREFIXES):
                pairs.append((k, v))
    else:
        raise checks.ArgumentTypeError(f"env must be a mapping, pasted text or None, got {type(env).__name__}")
    findings = [_finding(k, v) for k, v in pairs]
    return sorted(findings, key=lambda f: (VERDICTS.index(f.verdict), f.name))


def report(findings: list[EnvFinding], *, width: int = 110) -> str:
    """The findings as text a terminal or a notebook cell shows: one block per variable, wrapped at ``width``
    on word boundaries. Taught in chapter 23."""
    import textwrap

    if not findings:
        return "no NCCL / libfabric / rdma-core variables set: NCCL's defaults apply"
    out = []
    for f in findings:
        head = f"{f.name}={f.value}" if f.value is not None else f"{f.name} (no value given)"
        head += f"  [{f.verdict}]  {f.component}"
        if f.debugging_only:
            head += ", Debugging section"
        body = f"does: {f.what}. default: {f.default}." + (f" {f.advice}." if f.advice else "")
        out.append(head)
        out.extend(textwrap.wrap(body, width, initial_indent="    ", subsequent_indent="    "))
        if f.url:
            out.append(f"    see {f.url}")
    counts = {v: sum(f.verdict == v for f in findings) for v in VERDICTS}
    out.append(", ".join(f"{n} {v}" for v, n in counts.items() if n))
    return "\n".join(out)
