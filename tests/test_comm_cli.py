"""`labkit comm` CLI: bench, parse (auto-detect), model."""
from __future__ import annotations

import json

import pytest

from labkit.cli import main
from labkit.cli.comm import parse_size
from labkit.paths import dataset


def test_parse_each_kind(capsys):
    for name, kind in [("nccl_tests_all_reduce_2node_25gbe.SYNTHETIC.txt", "nccl-tests"),
                       ("nccl_debug_2node_25gbe.SYNTHETIC.log", "nccl-debug"),
                       ("topo_dgx_h100_like.SYNTHETIC.txt", "topology")]:
        assert main(["comm", "parse", str(dataset("comm", name)), "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["kind"] == kind and out["errors"] == []


def test_parse_garbage_and_missing(tmp_path, capsys):
    f = tmp_path / "x.txt"
    f.write_text("nothing to see\n")
    assert main(["comm", "parse", str(f)]) == 2
    assert "not nccl-tests output" in capsys.readouterr().err
    assert main(["comm", "parse", str(tmp_path / "missing.txt")]) == 2


def test_model_bert_large_case(capsys):
    assert main(["comm", "model", "--size", "1.3GB", "--nranks", "4", "--bw-gbs", "12"]) == 0
    ring = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("ring")][0]
    # bandwidth-bound ring: busbw = link bandwidth; t = 1.5 * 1.3 GB / 12 GB/s + 6 alpha = 162.5 ms
    assert ring.split()[1] == "162.530" and ring.split()[-2] == "12.00"


def test_sizes():
    assert parse_size("4M") == 4 * 2**20 and parse_size("1GB") == 10**9 and parse_size("1GiB") == 2**30
    with pytest.raises(ValueError, match="size '4X'"):
        parse_size("4X")


def test_bench_json(capsys):
    assert main(["comm", "bench", "--nprocs", "2", "--min-bytes", "1K", "--max-bytes", "64K", "--factor", "8",
                 "--iters", "3", "--warmup", "1", "--fit", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["size"] for r in out["table"]] == [1024, 8192, 65536]
    assert "all_reduce" in out["fits"]
