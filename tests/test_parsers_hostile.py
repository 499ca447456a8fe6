"""Every text parser in labkit against hostile input (issue #13): linear time, clear refusals, no
non-finite or negative figures.

Parsers: nccl-tests tables, NCCL_DEBUG=INFO logs, ``nvidia-smi topo -m``, the comm format detector and
``comm.parse``, ``nsys stats`` CSV, ``nvidia-smi --query-gpu`` CSV, ``nvidia-smi dmon``, ``dcgmi dmon``,
cpulists, ``lscpu``, and the Chrome-trace loader. Each gets a 10 MB line, 1 MB runs of digits and dashes,
binary bytes decoded with replacement, 200 k empty lines, and lines just under the 64 KiB cap built to
make a backtracking pattern explode (the NCCL log parser took 69 s on an 80 k-character line): each must finish in under a
second (linear against quadratic: a margin of 100x on these sizes) and either return an empty or
flagged result or raise ValueError saying what is wrong. Seeded mutations of the shipped datasets must
raise nothing but ValueError and yield no inf and no negative figure.
"""
from __future__ import annotations

import math
import random
import re
import time

import numpy as np
import pandas as pd
import pytest

from labkit import comm
from labkit.checks import MAX_LINE
from labkit.cli import main
from labkit.comm.parse import parse as comm_parse
from labkit.nsys.stats import NsysStats, parse_stats_csv
from labkit.paths import dataset
from labkit.telemetry.numa import parse_cpulist, parse_lscpu
from labkit.telemetry.smi import TelemetryTable, parse_dcgmi_dmon, parse_query_gpu, parse_smi_dmon
from labkit.trace.load import load as load_trace
from labkit.trace.runs import read_rank

MB = 1_000_000


def _trace(text: str, tmp_path):
    p = tmp_path / "hostile.json"
    p.write_text(text, errors="replace")
    try:
        return load_trace(p)
    except ValueError as e:
        assert "hostile.json" in str(e)            # the error names the file
        raise


PARSERS = {
    "nccl_tests": lambda t, _: comm.parse_nccl_tests(t),
    "nccl_debug": lambda t, _: comm.parse_nccl_debug(t),
    "topology": lambda t, _: comm.parse_topology(t),
    "detect_format": lambda t, _: comm.detect_format(t),
    "comm.parse": lambda t, _: comm_parse(t, source="hostile.txt"),
    "comm.parse(nccl-tests)": lambda t, _: comm_parse(t, "nccl-tests", source="hostile.txt"),
    "comm.parse(nccl-debug)": lambda t, _: comm_parse(t, "nccl-debug", source="hostile.txt"),
    "comm.parse(topology)": lambda t, _: comm_parse(t, "topology", source="hostile.txt"),
    "nsys_stats": lambda t, _: parse_stats_csv(t),
    "query_gpu": lambda t, _: parse_query_gpu(t),
    "smi_dmon": lambda t, _: parse_smi_dmon(t),
    "dcgmi_dmon": lambda t, _: parse_dcgmi_dmon(t),
    "cpulist": lambda t, _: parse_cpulist(t),
    "lscpu": lambda t, _: parse_lscpu(t),
    "trace_load": _trace,
}


def _binaryish(n: int, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, n, dtype=np.uint8).tobytes().decode("utf-8", errors="replace")


HOSTILE = {
    "10 MB line": lambda: ("host-01.x_y<z>" * (10 * MB // 14 + 1))[:10 * MB],
    "1 MB of digits": lambda: "1" * MB,
    "1 MB of dashes": lambda: "-" * MB,
    "256 kB binary, decoded with replacement": lambda: _binaryish(MB // 4),     # ~7000 short lines
    "200 k empty lines": lambda: "\n" * 200_000,
}

# Lines just under the 64 KiB cap, so that every pattern runs on them: each one made a backtracking
# pattern of the old parsers quadratic or exponential.
N = MAX_LINE - 200
UNDER_CAP = {
    "NCCL header of host characters": "h:1:2 " + "a" * N + "[0] NCCL INFOx",
    "NCCL ring of one long number": "h:1:2 [0] NCCL INFO Channel 00 : " + "1" * N + "x",
    "NCCL ring of many numbers": "h:1:2 [0] NCCL INFO Ring 00 : " + "1 -> " * (N // 5) + "x",
    "NCCL setting padded with spaces": "h:1:2 [0] NCCL INFO NCCL_X set by environment to " + " " * N + "x",
    "nccl-tests row of digits": "8 2 float sum -1 " + "1" * N + "x 1 1 0 1 1 1 0",
    "nccl-tests out-of-bounds count of digits": "# Out of bounds values : " + "1" * N,
    "nccl-tests mpirun -np of digits": "mpirun -np " + "1" * (N // 2) + " all_reduce_perf -g " + "2" * (N // 2),
    "NCCL WARN file token without a line": "h:1:2 [0] " + "a" * N + " NCCL WARN x",
    "NCCL devices repeated": "[0] 1.5 " * (N // 8) + "NCCL INFO x",
    "NCCL comm id of hex digits": "h:1:2 [0] NCCL INFO comm 0x1 commId 0x" + "f" * N,
    "nsys banner of brackets": "Processing [" + "[a/" * (N // 3),
    "nsys file name of a_ pairs": "a_" * (N // 2) + ".cs",
    "query-gpu header of brackets": "timestamp, power.draw " + "[" * N,
    "query-gpu header of spaces": "timestamp, power.draw" + " " * N + "[W",
    "words": "word " * (N // 5),
    "digits": "1" * N,
    "dashes": "-" * N,
    "mpirun prefix": "[1,0]<std" + "[1,1" * (N // 4),
}


def _flagged(name: str, result) -> bool:
    """True when ``result`` holds nothing, or reports what it skipped."""
    if isinstance(result, str):                      # detect_format
        return True
    if isinstance(result, tuple):                    # comm.parse found something: it must be a real result
        return False
    if isinstance(result, comm.NcclTestsResult):
        return result.rows.empty
    if isinstance(result, comm.NcclDebugInfo):
        return result.n_lines == 0 or bool(result.errors)
    if isinstance(result, comm.Topology):
        return not result.links
    if isinstance(result, NsysStats):
        return not any(len(t) for t in result.tables.values())
    if isinstance(result, TelemetryTable):
        return result.frame.empty
    if isinstance(result, list):                     # cpulist
        return len(result) < 2
    if isinstance(result, dict):                     # lscpu: lines with a colon become keys
        return True
    return False


def _run(name: str, text: str, tmp_path, *, tries: int = 3):
    """Run one parser: (result, ValueError or None, seconds). A run over a second is repeated (up to
    ``tries`` in all) and the fastest kept: on a shared machine another process can stall one run, but
    a quadratic parser is slow every time."""
    best = math.inf
    for _ in range(tries):
        t = time.perf_counter()
        try:
            result, err = PARSERS[name](text, tmp_path), None
        except ValueError as e:
            result, err = None, e
        best = min(best, time.perf_counter() - t)
        if best < 1.0:
            break
    return result, err, best


@pytest.mark.parametrize("payload", list(HOSTILE))
@pytest.mark.parametrize("name", list(PARSERS))
def test_hostile_input_is_fast_and_refused_clearly(name, payload, tmp_path):
    text = HOSTILE[payload]()
    result, err, took = _run(name, text, tmp_path)
    assert took < 1.0, f"{name} took {took:.2f} s on {payload}"
    if err is not None:
        assert len(str(err)) > 20, f"{name}: unclear error {err!r}"
    else:
        assert _flagged(name, result), f"{name} made something of {payload}: {result!r:.200}"


@pytest.mark.parametrize("name", [n for n in PARSERS if n != "trace_load"])
def test_lines_under_the_cap_that_used_to_backtrack_are_linear(name, tmp_path):
    for what, line in UNDER_CAP.items():
        assert len(line) <= MAX_LINE
        for text in (line, line + "\n" + line):
            _, _, took = _run(name, text, tmp_path)
            assert took < 1.0, f"{name} took {took:.2f} s on a {len(line)}-character line: {what}"


def test_a_long_line_is_reported_with_its_number_and_the_rest_is_kept():
    good = dataset("comm", "nccl_tests_all_reduce_h100_nvlink_8gpu.SYNTHETIC.txt").read_text().splitlines()
    clean = comm.parse_nccl_tests("\n".join(good))
    r = comm.parse_nccl_tests("\n".join(good[:5] + ["7" * (10 * MB)] + good[5:]))
    assert len(r.rows) == len(clean.rows)
    (n, why, raw), = r.errors
    assert n == 6 and "line 6 is 10,000,000 characters long" in why and "right file" in why and len(raw) <= 200
    dbg = comm.parse_nccl_debug("h:1:2 [0] NCCL INFO " + "x" * (MAX_LINE + 1) + "\nh:1:2 [0] NCCL INFO Using network IB")
    assert dbg.network == "IB" and dbg.errors[0][0] == 1 and "NCCL_DEBUG=INFO log line" in dbg.errors[0][1]
    st = parse_stats_csv("x" * (MAX_LINE + 1))
    assert st.errors[0].startswith("line 1 is 65,537 characters long")
    q = parse_query_gpu("timestamp, index\n" + "1," * MAX_LINE)
    assert q.errors[0].startswith("line 2 is")
    with pytest.raises(ValueError, match="lscpu line"):
        parse_lscpu("Model name: x\n" + "y" * (MAX_LINE + 1))
    with pytest.raises(ValueError, match="cpulist is .* characters long"):
        parse_cpulist("1," * MAX_LINE)


# ----------------------------------------------------------------------------- non-finite / negative figures
NCCL_HEAD = ("# nThread 1 nGpus 1 minBytes 8 maxBytes 64 step: 2(factor) warmup iters: 5 iters: 20\n"
             "#       size         count      type   redop    root     time   algbw   busbw #wrong"
             "     time   algbw   busbw #wrong\n")
NCCL_OK = "           8             2     float     sum      -1    10.00    0.00    0.00      0    10.00    0.00    0.00      0\n"


@pytest.mark.parametrize("row, why", [
    ("16 4 float sum -1 1e999 0.00 0.00 0 10.0 0.0 0.0 0", "oop_time_us=inf"),
    ("16 4 float sum -1 10.0 0.00 -3.5 0 10.0 0.0 0.0 0", "oop_busbw=-3.5"),
    ("16 4 float sum -1 10.0 0.00 0.00 0 10.0 nan 0.0 0", "ip_algbw 'nan' is not a number"),
    ("16 4 float sum -1 10.0 0.00 0.00 -1 10.0 0.0 0.0 0", "oop_wrong=-1"),
    ("16 4 float sum -1 10.0 inf 0.00 0 10.0 0.0 0.0 0", "oop_algbw 'inf' is not a number"),
])
def test_nccl_tests_rows_with_impossible_figures_are_bad_lines(row, why):
    r = comm.parse_nccl_tests(NCCL_HEAD + NCCL_OK + row + "\n")
    assert list(r.rows["size"]) == [8]
    (n, reason, _), = r.errors
    assert n == 4 and why in reason


def test_nccl_tests_negative_or_infinite_average_is_refused():
    for avg in ("-12.5", "1e999"):
        r = comm.parse_nccl_tests(NCCL_HEAD + NCCL_OK + f"# Avg bus bandwidth    : {avg}\n")
        assert r.avg_busbw is None and r.errors[0][0] == 4 and "Avg bus bandwidth" in r.errors[0][1]
    with pytest.raises(ValueError, match="no nccl-tests rows found in run.log .*first bad line 3: .*busbw"):
        comm_parse(NCCL_HEAD + "16 4 float sum -1 10 0 -1 0 10 0 0 0\n# Avg bus bandwidth : -1\n",
                   source="run.log")


def test_forcing_a_format_on_garbage_raises_naming_file_and_format():
    for fmt, what in [("nccl-tests", "no nccl-tests rows"),
                      ("nccl-debug", "no NCCL INFO/WARN lines with a 'host:pid:tid [dev]' header"),
                      ("topology", "no nvidia-smi topo -m matrix rows")]:
        with pytest.raises(ValueError, match=re.escape(f"{what} found in garbage.txt (read as {fmt}")):
            comm_parse("nothing here\n12 34\n", fmt, source="garbage.txt")
    with pytest.raises(ValueError, match="format='csv' is not valid"):
        comm_parse("x", "csv")


def test_cli_exits_2_with_one_line_on_forced_garbage_and_keeps_good_rows(tmp_path, capsys):
    g = tmp_path / "garbage.txt"
    g.write_bytes(b"\x00\xff binary junk\n" + b"9" * MB)
    for fmt in ("nccl-tests", "nccl-debug", "topology", "auto"):
        assert main(["comm", "parse", "--format", fmt, str(g)]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "garbage.txt" in err, err
    mixed = tmp_path / "mixed.txt"
    mixed.write_text(NCCL_HEAD + NCCL_OK + "16 4 float sum -1 1e999 0 0 0 10 0 0 0\n")
    assert main(["comm", "parse", str(mixed)]) == 0
    out = capsys.readouterr().out
    assert "bad line 4: oop_time_us=inf is not valid" in out
    assert main(["comm", "parse", str(tmp_path)]) == 2             # a folder: one line, exit 2
    assert "is a folder" in capsys.readouterr().err


NSYS_HEAD = ("\n ** CUDA GPU Kernel Summary (cuda_gpu_kern_sum):\n\n"
             "Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name\n"
             "80.0,8000,4,2000.0,2000.0,1900,2100,80.0,good_kernel\n")


@pytest.mark.parametrize("row, why", [
    ("20.0,1e999,1,2000.0,2000.0,2000,2000,0.0,k", "total_ns=inf"),
    ("20.0,2000,1,nan,2000.0,2000,2000,0.0,k", "avg_ns=nan"),
    ("20.0,2000,1,2000.0,2000.0,-5,2000,0.0,k", "min_ns=-5"),
    ("20.0,2000,1.5,2000.0,2000.0,2000,2000,0.0,k", "count=1.5"),
    ("20.0,2000,1e30,2000.0,2000.0,2000,2000,0.0,k", "count=1e30"),
    ("20.0,2000,1,2000.0,2000.0,2000,infinity,0.0,k", "max_ns=inf"),
])
def test_nsys_rows_with_impossible_figures_are_bad_lines(row, why):
    st = parse_stats_csv(NSYS_HEAD + row + "\n")
    assert list(st["cuda_gpu_kern_sum"]["name"]) == ["good_kernel"]
    (e,) = st.errors
    assert e.startswith("line 6:") and why in e


@pytest.mark.parametrize("parser, text, why", [
    (parse_query_gpu, "index, power.draw [W]\n0, 100 W\n1, 1e999 W\n", "line 3: power.draw=inf"),
    (parse_query_gpu, "index, power.draw [W]\n0, 100 W\n1, -40 W\n", "line 3: power.draw=-40"),
    (parse_query_gpu, "index, power.draw [W]\n0, 100 W\n0.5, 40 W\n", "line 3: gpu=0.5 is not valid"),
    (parse_query_gpu, "index, power.draw [W]\n0, 100 W\n1, nan\n", "line 3: power.draw: 'nan' is not a number"),
    (parse_smi_dmon, "# gpu pwr sm\n# Idx W %\n 0 100 50\n 1 -3 50\n", "line 4: pwr=-3"),
    (parse_dcgmi_dmon, "#Entity SMACT NVLTX\nID\nGPU 0 0.5 100\nGPU 1 0.5 1e999\n", "line 4: NVLTX=inf"),
])
def test_telemetry_rows_with_impossible_figures_are_bad_lines(parser, text, why):
    t = parser(text)
    assert len(t.frame) == 1 and list(t.frame["gpu"]) == [0]
    (e,) = t.errors
    assert e.startswith(why), e


def test_query_gpu_unreadable_timestamp_names_its_line():
    t = parse_query_gpu("timestamp, index\n2024/05/01 12:00:00.100, 0\n2024/13/45 99:00:00.100, 1\n")
    assert list(t.frame["gpu"]) == [0] and t.errors == ["line 3: unreadable timestamp"]


def test_cpulist_refuses_absurd_ids_and_counts():
    with pytest.raises(ValueError, match="CPU id 100000 in '0-100000' is not valid"):
        parse_cpulist("0-100000")
    with pytest.raises(ValueError, match="more than 65536 CPUs"):
        parse_cpulist("0-60000,0-60000")
    with pytest.raises(ValueError, match="is not 'N' or 'N-M'"):
        parse_cpulist("1" * 10)


def test_trace_with_non_finite_times_or_bad_json_names_the_file(tmp_path):
    p = tmp_path / "rank0.json"
    p.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1e999, "dur": 1}]}')
    with pytest.raises(ValueError, match=r"rank0.json: event 0 \('k'\): 'ts'=inf is not valid: use a finite number"):
        read_rank(p)
    for body, why in [("1" * MB, "rank0.json is not a trace"), ("[" * MB, "nested too deeply"),
                      ('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": NaN}]}',
                       "'dur'=nan")]:
        p.write_text(body)
        with pytest.raises(ValueError, match=why):
            read_rank(p)


# ----------------------------------------------------------------------------- seeded mutations of datasets
FILES = {
    "comm": ["nccl_debug_2node_25gbe.SYNTHETIC.log", "nccl_debug_h100_nvlink_8gpu.SYNTHETIC.log",
             "nccl_tests_all_gather_h100_nvlink_8gpu.SYNTHETIC.txt", "nccl_tests_all_reduce_2node_25gbe.SYNTHETIC.txt",
             "nccl_tests_all_reduce_pcie_node_8gpu.SYNTHETIC.txt", "topo_dgx_h100_like.SYNTHETIC.txt"],
    "telemetry": ["comm_bound_dcgmi_dmon.txt", "comm_bound_query_gpu.csv", "healthy_dcgmi_dmon.txt",
                  "launch_bound_query_gpu.csv", "topo_pcie_4gpu.txt"],
    "nsys": ["step_sync_stats.csv", "step_async_stats.csv"],
}
_NUMERIC_JUNK = ["1e999", "-1", "-0.5", "nan", "inf", "-1e999", "9" * 30, "1e", "0x1"]
_JUNK = _NUMERIC_JUNK + ["-", "N/A", "1,2", "[", "]", "\x00", "  ", "#", ":"]


def _mutate(text: str, rng: random.Random) -> str:
    lines = text.splitlines()
    for _ in range(rng.randrange(1, 6)):
        kind = rng.randrange(5)
        i = rng.randrange(len(lines)) if lines else 0
        if kind == 0:                                        # truncate the file
            return "\n".join(lines)[: rng.randrange(len(text) + 1)]
        if kind == 1 and lines:                              # duplicate lines
            lines[i:i] = lines[i:i + rng.randrange(1, 4)] * rng.randrange(1, 3)
        elif kind == 2 and lines and lines[i]:               # flip characters
            chars = list(lines[i])
            for _ in range(rng.randrange(1, 4)):
                chars[rng.randrange(len(chars))] = rng.choice("0123456789-.e+ ,x[]:#\t")
            lines[i] = "".join(chars)
        elif kind == 3 and lines:                            # a number (or any word) replaced by junk
            toks = list(re.finditer(r"\d[\w.+-]*", lines[i])) or list(re.finditer(r"\S+", lines[i]))
            if toks:
                t = rng.choice(toks)
                junk = rng.choice(_NUMERIC_JUNK if rng.random() < 0.7 else _JUNK)
                lines[i] = lines[i][:t.start()] + junk + lines[i][t.end():]
        elif kind == 4 and lines and "," in lines[i]:        # a CSV field replaced by junk
            f = lines[i].split(",")
            f[rng.randrange(len(f))] = rng.choice(_NUMERIC_JUNK if rng.random() < 0.7 else _JUNK)
            lines[i] = ",".join(f)
    return "\n".join(lines)


def _figures(result) -> list[float]:
    """Every physical figure (time, size, bandwidth, count, reading) a parser returned."""
    if isinstance(result, tuple):
        result = result[1]
    if isinstance(result, comm.NcclTestsResult):
        cols = [c for c in result.rows.columns if c not in ("type", "redop", "root")]  # root -1 = none
        vals = pd.to_numeric(result.rows[cols].stack(), errors="raise").tolist()
        return vals + ([result.avg_busbw] if result.avg_busbw is not None else [])
    if isinstance(result, comm.NcclDebugInfo):
        return [v for v in (result.nranks, result.nnodes, result.n_channels) if v is not None] + \
            list(result.transports.values())
    if isinstance(result, comm.Topology):
        return [result.nvlinks(a, b) for a in result.links for b in result.links[a] if b in result.devices]
    if isinstance(result, NsysStats):
        return [v for t in result.tables.values() for v in t.select_dtypes("number").to_numpy().ravel().tolist()]
    if isinstance(result, TelemetryTable):
        return result.frame.select_dtypes("number").astype(float).to_numpy().ravel().tolist()
    return []


MUTATION_PARSERS = ["nccl_tests", "nccl_debug", "topology", "detect_format", "comm.parse", "nsys_stats",
                    "query_gpu", "smi_dmon", "dcgmi_dmon", "lscpu"]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("folder", list(FILES))
def test_mutated_datasets_raise_only_valueerror_and_never_give_impossible_figures(folder, seed, tmp_path):
    rng = random.Random(f"{folder}-{seed}")
    for name in FILES[folder]:
        base = dataset(folder, name).read_text()
        for _ in range(6):
            text = _mutate(base, rng)
            for p in MUTATION_PARSERS:
                result, err, took = _run(p, text, tmp_path)
                assert took < 1.0, f"{p} took {took:.2f} s on a mutation of {name}"
                if err is not None:
                    assert str(err), p
                    continue
                figs = _figures(result)
                assert all(not math.isinf(v) and not v < 0 for v in figs), (p, name, figs)


@pytest.mark.parametrize("name", ["step_sync.sqlite", "step_async.sqlite"])
def test_binary_files_decoded_with_replacement(name, tmp_path):
    text = dataset("nsys", name).read_bytes().decode("utf-8", errors="replace")
    for p in PARSERS:
        result, err, took = _run(p, text, tmp_path)
        assert took < 1.0, f"{p} took {took:.2f} s on {name}"
        assert err is not None or _flagged(p, result), f"{p} made something of {name}"


# ---------------------------------------------------------------- issue #28: plausibility of what parsers read
def _nccl_tests_text():
    from labkit.paths import dataset

    return dataset("comm", "nccl_tests_all_reduce_h100_nvlink_8gpu.SYNTHETIC.txt").read_text()


def test_nccl_tests_row_whose_busbw_is_not_algbw_times_the_bus_factor_is_a_bad_line():
    """busbw is algbw × 2(n−1)/n for all_reduce: a row with busbw 10× algbw was kept as a measurement."""
    from labkit.comm.parse import parse_nccl_tests

    lines = _nccl_tests_text().splitlines()
    k = next(i for i, ln in enumerate(lines) if ln.strip().startswith("33554432"))
    toks = lines[k].split()
    toks[7] = f"{float(toks[6]) * 10:.2f}"                     # oop_busbw := 10 × oop_algbw
    lines[k] = "  ".join(toks)
    good = parse_nccl_tests(_nccl_tests_text())
    r = parse_nccl_tests("\n".join(lines))
    assert len(r.rows) == len(good.rows) - 1 and 33554432 not in set(r.rows["size"])
    (line, why, _), = [e for e in r.errors if e[0] == k + 1]
    assert "field oop_busbw=" in why and "10.00 x oop_algbw" in why and "all_reduce on 8 ranks" in why
    assert not good.errors


@pytest.mark.parametrize("field,value", [("nGpus", "999999999"), ("nThread", "0"), ("nGpus", "-3")])
def test_nccl_tests_implausible_header_counts(field, value):
    from labkit.comm.parse import parse_nccl_tests

    text = "# nThread 1 nGpus 8 minBytes 8 maxBytes 128 step: 2(factor)\n".replace(
        f"{field} {'1' if field == 'nThread' else '8'}", f"{field} {value}")
    text += "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"
    text += "           8             2     float     sum      -1     25.30    0.00    0.00      0     25.10    0.00    0.00      0\n"
    r = parse_nccl_tests(text)
    assert any(f"field {field}={value} is not plausible" in why for _, why, _ in r.errors), r.errors
    assert field not in r.params


@pytest.mark.parametrize("msg,match", [
    ("comm 0x1 rank 0 nRanks 16 nNodes 0 localRanks 8", r"field nNodes=0 is not plausible for nRanks=16"),
    ("comm 0x1 rank 0 nRanks 999999999 nNodes 2 localRanks 8", r"field nRanks=999999999 is not plausible"),
    ("comm 0x1 rank 0 nRanks 4 nNodes 9 localRanks 8", r"field nNodes=9 is not plausible for nRanks=4"),
])
def test_nccl_debug_implausible_ranks_and_nodes(msg, match):
    from labkit.comm.parse import parse_nccl_debug

    info = parse_nccl_debug(f"host1:12:13 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\nhost1:12:13 [0] NCCL INFO {msg}\n")
    assert info.nnodes is None and info.nranks is None
    (line, why, _), = info.errors
    assert line == 2 and re.search(match, why) and why.startswith("line 2: field")
