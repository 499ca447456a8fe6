"""Parser of NVIDIA/nccl-tests tables (``all_reduce_perf`` …): ``labkit.comm.nccl_tests``.

Old format (``size count type redop time algbw busbw error``) and new (``… redop root time algbw busbw
#wrong``), out-of-place and in-place columns, ``[1,0]<stdout>:`` prefixes from mpirun, ``N/A``, the
``# Avg bus bandwidth`` line. Bad lines are kept out and reported (``.errors``: list of (line number,
reason, line)): rows with a non-finite (``1e999``) or negative time, bandwidth or wrong count, and lines
longer than :data:`labkit.checks.MAX_LINE`. The parser never raises on garbage and runs in time linear
in the input. Taught in chapter 11 (communication diagnostics).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import pandas as pd

from labkit.checks import MAX_LINE, long_line, nonneg
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
    (``ip_*``) time (us), algbw and busbw (GB/s = 1e9 B/s), wrong counts (None = N/A).

    Taught in chapter 11 (communication diagnostics).
    """

    rows: pd.DataFrame
    avg_busbw: float | None = None          # GB/s, from "# Avg bus bandwidth"
    errors: list = field(default_factory=list)   # (line number, reason, line)
    op: str | None = None
    nranks: int | None = None
    params: dict = field(default_factory=dict)   # nThread, nGpus, minBytes, ... from the header
    devices: list = field(default_factory=list)  # "Rank N ... on host device d [bus] NAME" lines
    out_of_bounds: str | None = None
    format: str | None = None                  # "new" (root, #wrong) or "old" (error)

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
        if self.errors:
            s += f"; {len(self.errors)} bad line(s) skipped"
        return s


_COLS = ["size", "count", "type", "redop", "root", "oop_time_us", "oop_algbw", "oop_busbw", "oop_wrong",
         "ip_time_us", "ip_algbw", "ip_busbw", "ip_wrong"]
_LEADS = {5: ["size", "count", "type", "redop", "root"],   # new format (nccl-tests >= 2.10)
          4: ["size", "count", "type", "redop"],           # old format, reductions
          3: ["size", "count", "type"]}                    # old format, all_gather / broadcast
_RANK_TAG = re.compile(r"^\[\d+\]\s+")                     # "[0] " tags (mpirun --tag-output, pdsh ...)
_PERF = re.compile(r"\b([a-z_]+)_perf\b")                 # "all_reduce_perf" on the command line


def _lead_from_count(n: int) -> list[str]:
    for lead in (5, 4, 3):
        if n in (lead + 8, lead + 4):
            return _LEADS[lead]
    raise ValueError(f"{n} fields do not match any nccl-tests row layout (7, 8, 9, 11, 12 or 13 fields)")


def _parse_row(toks: list[str], lead: list[str]) -> dict:
    """One data row: the lead columns (size count type [redop] [root]) then 4 columns per placement."""
    nlead = len(lead)
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
        if not re.match(r"^[a-z][a-z0-9_]*$", toks[3]):
            raise ValueError(f"redop {toks[3]!r} is not a reduction name")
        row["redop"] = toks[3]
    if "root" in lead:
        if not re.match(r"^-?\d+$", toks[4]):
            raise ValueError(f"root {toks[4]!r} is not an integer")
        row["root"] = int(toks[4])
    rest = toks[nlead:]
    for prefix, chunk in (("oop", rest[:4]), ("ip", rest[4:8])):
        if not chunk:
            for k in ("time_us", "algbw", "busbw", "wrong"):
                row[f"{prefix}_{k}"] = None
            continue
        t, a, b, w = (_num(x, f"{prefix}_{k}") for x, k in zip(chunk, ("time_us", "algbw", "busbw", "wrong"),
                                                                   strict=True))
        row.update({f"{prefix}_time_us": t, f"{prefix}_algbw": a, f"{prefix}_busbw": b, f"{prefix}_wrong": w})
    return row


def parse_nccl_tests(text: str, *, op: str | None = None) -> NcclTestsResult:
    """Parse nccl-tests output (any op, old or new format); never raises on bad lines.

    The column layout is read from the ``# size count type ...`` header when there is one, else
    inferred from the number of fields. ``op`` names the test when the text does not (it is detected
    from ``*_perf`` command lines). Taught in chapter 11 (communication diagnostics).
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    rows, errors, devices, params = [], [], [], {}
    lead, fmt, avg, oob, found_op = None, None, None, None, None
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
        if m and found_op is None:
            try:
                found_op = canonical_op(m.group(1))
            except ValueError:
                pass
        if s.startswith("#"):
            body = s.lstrip("#").strip()
            if re.match(r"^size\s+count\s+type", body):
                cols = body.split()
                lead = cols[:cols.index("time")] if "time" in cols else None
                fmt = "new" if "root" in cols else "old"
            elif body.startswith("Avg bus bandwidth"):
                m2 = re.search(r":\s*([0-9.eE+-]+)", body)
                try:
                    avg = nonneg("Avg bus bandwidth", float(m2.group(1))) if m2 else None
                except ValueError as e:
                    avg = None
                    errors.append((i, f"unreadable Avg bus bandwidth: {e}", raw))
            elif body.startswith("Out of bounds values"):
                oob = body.split(":", 1)[-1].strip()
            elif body.startswith("nThread"):
                toks = body.split()
                for k, v in zip(toks[0::2], toks[1::2], strict=False):
                    params[k.rstrip(":")] = v
            elif re.match(r"^Rank\s+\d+", body):
                devices.append(body)
            continue
        if not s[0].isdigit():
            continue  # NCCL INFO lines, shell prompts, ... are not ours
        toks = s.split()
        try:
            use = lead if lead and len(toks) in (len(lead) + 4, len(lead) + 8) else _lead_from_count(len(toks))
            rows.append(_parse_row(toks, use))
        except (ValueError, IndexError) as e:
            errors.append((i, str(e), raw))
    df = pd.DataFrame(rows, columns=_COLS)
    ranks = {re.match(r"^Rank\s+(\d+)", d).group(1) for d in devices}
    return NcclTestsResult(rows=df, avg_busbw=avg, errors=errors, op=found_op, nranks=len(ranks) or None,
                           params=params, devices=devices, out_of_bounds=oob, format=fmt)
