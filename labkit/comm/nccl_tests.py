"""Parser of NVIDIA/nccl-tests tables (``all_reduce_perf`` …): ``labkit.comm.nccl_tests``.

Old format (``size count type [redop|root] time algbw busbw error``) and new (``… redop root time algbw
busbw #wrong``), out-of-place and in-place columns, ``[1,0]<stdout>:`` prefixes from mpirun, ``N/A``, the
``# Avg bus bandwidth`` line. Bad lines are kept out and reported (``.errors``: list of (line number,
reason, line)): rows with a non-finite (``1e999``) or negative time, bandwidth or wrong count, and lines
longer than :data:`labkit.checks.MAX_LINE`. The parser never raises on garbage and runs in time linear
in the input. Taught in chapter 11 (communication diagnostics).

Before nccl-tests' "Resync with NCCL 2.13" (commit 51af557, August 2022) the last column of each half was
``error``: the largest deviation from the expected result, a float printed ``%5.0le`` (``0e+00``). Since
then it is ``#wrong``, a count of wrong elements. The parser keeps them apart: ``*_wrong`` (new) and
``*_error`` (old); the other is None. The old broadcast/reduce tables had ``root`` where reductions had
``redop``; without a header the fourth field decides (an integer is a root).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import pandas as pd

from labkit.checks import MAX_LINE, ArgumentTypeError, long_line, nonneg
from labkit.comm.models import canonical_op
from labkit.comm.pasted import strip_prefix

# \d+(?:\.\d*)? rather than \d+\.?\d*: the latter can split a run of digits two ways at every point
# and backtracks quadratically on "111...1x"
_NUM = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$")
_DTYPES = {"float", "half", "double", "int8", "uint8", "int32", "uint32", "int64", "uint64", "bfloat16",
           "fp8_e4m3", "fp8_e5m2", "f8e4m3", "f8e5m2", "float32", "float16", "int", "char", "bf16"}


def _num(tok: str, name: str):
    """A time, bandwidth or count of wrong elements: None for N/A, else a finite number >= 0."""
    if tok in ("N/A", "n/a", "-"):
        return None
    if not _NUM.match(tok):
        raise ValueError(f"{name} {tok!r} is not a number")
    return nonneg(name, float(tok))          # 1e999 (inf) and negative figures are refused


@dataclass
class NcclTestsResult:
    """Parsed nccl-tests output. ``rows``: one per size with out-of-place (``oop_*``) and in-place
    (``ip_*``) time (us), algbw and busbw (GB/s = 1e9 B/s), wrong-element counts (``*_wrong``, new format)
    or largest deviations (``*_error``, old format); None = N/A or not in this format.
    ``nranks`` comes from the "Rank N" device lines, else from the command line and header
    (``mpirun -np`` × ``nThread`` × ``nGpus``); ``nranks_from`` says which.

    Taught in chapter 11 (communication diagnostics).
    """

    rows: pd.DataFrame
    avg_busbw: float | None = None          # GB/s, from "# Avg bus bandwidth"
    errors: list = field(default_factory=list)   # (line number, reason, line)
    op: str | None = None
    nranks: int | None = None
    params: dict = field(default_factory=dict)   # nThread, nGpus, minBytes, ... from the header
    devices: list = field(default_factory=list)  # "Rank N ... on host device d [bus] NAME" lines
    out_of_bounds: int | None = None           # "# Out of bounds values : 0 OK" -> 0
    out_of_bounds_status: str | None = None    # "OK" or "FAILED"
    format: str | None = None                  # "new" (#wrong) or "old" (error), from the header or the fields
    nranks_from: str | None = None             # "rank lines" or "nThread x nGpus" (x mpirun -np)

    def fit(self, place: str = "oop"):
        """α and β of the ring model (:func:`labkit.comm.fit_alpha_beta`) fitted to this table's times —
        ``place`` "oop" (out-of-place, default) or "ip" — on its op and rank count; feed it to
        :meth:`labkit.perf.Cluster.with_links` to price a cluster with the links it measured.
        Taught in chapter 11 (α–β fits) and chapter 24 (a cluster from its own measurements)."""
        from labkit.checks import one_of
        from labkit.comm.models import fit_alpha_beta

        col = f"{one_of('place', place, ('oop', 'ip'))}_time_us"
        if self.op is None or self.nranks is None:
            raise ValueError(f"this nccl-tests table does not say its {'op' if self.op is None else 'rank count'}: "
                             "parse it with op=... or keep the 'Rank N' device lines / the mpirun command line")
        rows = self.rows.dropna(subset=[col]) if col in self.rows else self.rows.iloc[0:0]
        rows = rows[rows["size"] > 0]
        if rows["size"].nunique() < 2:
            raise ValueError(f"a fit needs at least 2 sizes with a {place} time, this table has "
                             f"{rows['size'].nunique()}")
        return fit_alpha_beta(rows["size"], rows[col] * 1e-6, self.op, self.nranks)

    def implied_bus_factor(self) -> pd.Series:
        """busbw/algbw per row (out-of-place): compare with :func:`labkit.comm.bus_factor`."""
        return self.rows["oop_busbw"] / self.rows["oop_algbw"]

    def summary(self) -> str:
        if self.rows.empty:
            return f"nccl-tests: no rows parsed ({len(self.errors)} bad lines)"
        big = self.rows.iloc[-1]
        s = (f"nccl-tests {self.op or '?'} on {self.nranks or '?'} ranks: {len(self.rows)} sizes "
             f"{int(self.rows['size'].min())}..{int(self.rows['size'].max())} B; largest: busbw "
             f"{big['oop_busbw']:.2f} GB/s")
        if self.avg_busbw is not None:
            s += f"; Avg bus bandwidth {self.avg_busbw:.2f} GB/s"
        if self.out_of_bounds:
            s += f"; {self.out_of_bounds} out-of-bounds value(s) {self.out_of_bounds_status or ''}".rstrip()
        if self.errors:
            s += f"; {len(self.errors)} bad line(s) skipped"
        return s


_COLS = ["size", "count", "type", "redop", "root", "oop_time_us", "oop_algbw", "oop_busbw", "oop_wrong",
         "ip_time_us", "ip_algbw", "ip_busbw", "ip_wrong", "oop_error", "ip_error"]
_LEADS = {5: ["size", "count", "type", "redop", "root"],   # every test since 2.13; the old reduce_perf
          4: ["size", "count", "type", "redop"],           # old all_reduce / reduce_scatter (or root: broadcast)
          3: ["size", "count", "type"]}                    # old all_gather
_RANK_TAG = re.compile(r"^\[\d+\]\s+")                     # "[0] " tags (mpirun --tag-output, pdsh ...)
_PERF = re.compile(r"\b([a-z_]+)_perf\b")                 # "all_reduce_perf" on the command line
_NP = re.compile(r"(?:^|\s)(?:-np|-n|--np)\s+(\d{1,9})(?=\s|$)")     # mpirun/srun -np N, before the binary
_GT = re.compile(r"(?:^|\s)-([gt])\s*(\d{1,9})(?=\s|$)")              # *_perf -g G -t T, after it
_OOB = re.compile(r"(\d{1,18})(?:\s+(OK|FAILED))?")      # fullmatch on the stripped text


def _lead_from_count(n: int) -> list[str]:
    for lead in (5, 4, 3):
        if n in (lead + 8, lead + 4):
            return _LEADS[lead]
    raise ValueError(f"{n} fields do not match any nccl-tests row layout (7, 8, 9, 11, 12 or 13 fields)")


def _parse_row(toks: list[str], lead: list[str], old: bool) -> dict:
    """One data row: the lead columns (size count type [redop] [root]) then 4 columns per placement;
    the 4th of each is ``#wrong`` (new) or the old ``error`` deviation (``old``)."""
    nlead = len(lead)
    if lead is _LEADS[4] and re.match(r"^-?\d+$", toks[3]):    # headerless old broadcast/reduce: a root
        lead = ["size", "count", "type", "root"]
    if len(toks) not in (nlead + 4, nlead + 8):
        raise ValueError(f"expected {nlead + 8} fields ({' '.join(lead)} + 2x time algbw busbw wrong), "
                         f"got {len(toks)}")
    size, count = toks[0], toks[1]
    if not (size.isdigit() and count.isdigit()):
        raise ValueError("size and count must be integers")
    if toks[2] not in _DTYPES and not re.match(r"^[a-z][a-z0-9_]*$", toks[2]):
        raise ValueError(f"unknown type {toks[2]!r}")
    row = {"size": int(size), "count": int(count), "type": toks[2], "redop": None, "root": None}
    if "redop" in lead:
        tok = toks[lead.index("redop")]
        if not re.match(r"^[a-z][a-z0-9_]*$", tok):
            raise ValueError(f"redop {tok!r} is not a reduction name")
        row["redop"] = tok
    if "root" in lead:
        tok = toks[lead.index("root")]
        if not re.match(r"^-?\d+$", tok):
            raise ValueError(f"root {tok!r} is not an integer")
        row["root"] = int(tok)
    rest = toks[nlead:]
    last = "error" if old else "wrong"
    for prefix, chunk in (("oop", rest[:4]), ("ip", rest[4:8])):
        row[f"{prefix}_wrong"] = row[f"{prefix}_error"] = None
        if not chunk:
            for k in ("time_us", "algbw", "busbw"):
                row[f"{prefix}_{k}"] = None
            continue
        t, a, b, w = (_num(x, f"{prefix}_{k}") for x, k in zip(chunk, ("time_us", "algbw", "busbw", last),
                                                                   strict=True))
        if w is not None and not old and not w.is_integer():
            raise ValueError(f"{prefix}_wrong {w!r} is not a count of wrong elements")
        row.update({f"{prefix}_time_us": t, f"{prefix}_algbw": a, f"{prefix}_busbw": b, f"{prefix}_{last}": w})
    return row


def parse_nccl_tests(text: str, *, op: str | None = None) -> NcclTestsResult:
    """Parse nccl-tests output (any op, old or new format); never raises on bad lines.

    The column layout is read from the ``# size count type ...`` header when there is one, else
    inferred from the number of fields. ``op`` names the test when the text does not (it is detected
    from ``*_perf`` command lines). Taught in chapter 11 (communication diagnostics).
    """
    if not isinstance(text, str):
        raise ArgumentTypeError(f"text must be a str (nccl-tests output), got {type(text).__name__}")
    rows, errors, devices, params, opts, row_lines = [], [], [], {}, {}, []
    lead, fmt, avg, oob, oob_status, found_op, row_fmt = None, None, None, None, None, None, None
    if op is not None:
        found_op = canonical_op(op)
    for i, raw in enumerate(text.splitlines(), 1):
        if len(raw) > MAX_LINE:
            errors.append((i, long_line(i, raw, "nccl-tests"), raw[:200]))
            continue
        if not raw or raw.isspace():
            continue
        line = strip_prefix(raw)
        if line.startswith("["):
            line = _RANK_TAG.sub("", line)
        s = line.strip()
        if not s:
            continue
        m = _PERF.search(s) if "_perf" in s else None
        if m:
            if found_op is None:
                try:
                    found_op = canonical_op(m.group(1))
                except ValueError:
                    pass
            np_ = _NP.findall(s[:m.start()])
            opts.update({"np": int(np_[-1])} if np_ else {})
            opts.update((k, int(v)) for k, v in _GT.findall(s[m.end():]))
        if s.startswith("#"):
            body = s.lstrip("#").strip()
            if re.match(r"^size\s+count\s+type", body):
                cols = body.split()
                lead = cols[:cols.index("time")] if "time" in cols else None
                fmt = "old" if "error" in cols else "new"
            elif body.startswith("Avg bus bandwidth"):
                m2 = re.search(r":\s*([0-9.eE+-]+)", body)
                try:
                    avg = nonneg("Avg bus bandwidth", float(m2.group(1))) if m2 else None
                except ValueError as e:
                    avg = None
                    errors.append((i, f"unreadable Avg bus bandwidth: {e}", raw))
            elif body.startswith("Out of bounds values"):
                m3 = _OOB.fullmatch(body.split(":", 1)[-1].strip())
                if m3:
                    oob, oob_status = int(m3.group(1)), m3.group(2)
                else:
                    errors.append((i, "unreadable Out of bounds values (want a count, then OK or FAILED)", raw))
            elif body.startswith("nThread"):
                toks = body.split()
                for k, v in zip(toks[0::2], toks[1::2], strict=False):
                    k = k.rstrip(":")
                    if k in _COUNT_LIMITS and (not v.isdigit() or not 1 <= int(v) <= _COUNT_LIMITS[k]):
                        errors.append((i, f"field {k}={v[:30]} is not plausible (use 1 to {_COUNT_LIMITS[k]:,})", raw))
                        continue
                    params[k] = v
            elif re.match(r"^Rank\s+\d+", body):
                devices.append(body)
            continue
        if not s[0].isdigit():
            continue  # NCCL INFO lines, shell prompts, ... are not ours
        toks = s.split()
        try:
            use = lead if lead and len(toks) in (len(lead) + 4, len(lead) + 8) else _lead_from_count(len(toks))
            # without a header: 3 or 4 lead columns are old; with 5, a float in the 4th measure (0e+00) is old
            old = fmt == "old" if use is lead else (len(use) < 5 or any(c in toks[len(use) + 3] for c in ".eE"))
            rows.append(_parse_row(toks, use, old))
            row_lines.append((i, raw))
            row_fmt = row_fmt or ("old" if old else "new")
        except (ValueError, IndexError) as e:
            errors.append((i, str(e), raw))
    nranks, source = _nranks(devices, params, opts)
    if nranks is not None and nranks > MAX_RANKS:
        errors.append((0, f"{nranks:,} ranks (from {source}) is not plausible (at most {MAX_RANKS:,})", ""))
        nranks, source = None, None
    rows, bad = _check_busbw(rows, row_lines, found_op, nranks)
    errors = sorted(errors + bad, key=lambda e: e[0])
    df = pd.DataFrame(rows, columns=_COLS)
    return NcclTestsResult(rows=df, avg_busbw=avg, errors=errors, op=found_op, nranks=nranks, params=params,
                           devices=devices, out_of_bounds=oob, out_of_bounds_status=oob_status,
                           format=fmt or row_fmt, nranks_from=source)


MAX_RANKS = 1 << 24                                   # far past any job
_COUNT_LIMITS = {"nThread": 1024, "nGpus": 1024}      # per process: threads and GPUs one process drives


def _check_busbw(rows, row_lines, op, nranks):
    """Rows whose busbw is not algbw × nccl-tests' bus factor (within the 2-decimal rounding and 2 %) go to
    the errors: busbw is computed from algbw (``doc/PERFORMANCE.md``), so a row where it is 10× algbw was
    not printed by nccl-tests. Unknown op or rank count: the largest factor any op has (2)."""
    from labkit.comm.models import bus_factor

    if op is not None and nranks:
        lo = hi = bus_factor(op, nranks)
        what = f"{op} on {nranks} ranks has busbw = {lo:.3f} x algbw"
    else:
        lo, hi = 0.0, 2.0
        what = "busbw is at most 2 x algbw for every collective"
    keep, bad = [], []
    for r, (i, raw) in zip(rows, row_lines, strict=True):
        why = None
        for pre in ("oop", "ip"):
            a, b = r.get(f"{pre}_algbw"), r.get(f"{pre}_busbw")
            if a is None or b is None:
                continue
            tol = 0.006 * (1 + hi) + 0.02 * b
            if b < a * lo - tol or b > a * hi + tol:
                why = f"line {i}: field {pre}_busbw={b:g} is {b / a if a else float('inf'):.2f} x {pre}_algbw={a:g}; {what}"
                break
        (bad.append((i, why, raw)) if why else keep.append(r))
    return keep, bad


def _nranks(devices: list, params: dict, opts: dict) -> tuple[int | None, str | None]:
    """Ranks from the "Rank N" device lines, else nThread × nGpus (header, or -t/-g on the command
    line) × processes (mpirun -np/-n; 1 when absent, as for a single ``all_reduce_perf -g 8``)."""
    ranks = {re.match(r"^Rank\s+(\d+)", d).group(1) for d in devices}
    if ranks:
        return len(ranks), "rank lines"
    def _int(key, opt):
        v = params.get(key, opts.get(opt))
        return int(v) if isinstance(v, int) or (isinstance(v, str) and v.isdigit()) else None
    threads, gpus = _int("nThread", "t"), _int("nGpus", "g")
    if gpus is None and threads is None:
        return None, None
    n = (threads or 1) * (gpus or 1) * opts.get("np", 1)
    return (n, "nThread x nGpus" + (" x mpirun -np" if "np" in opts else "")) if n > 0 else (None, None)
