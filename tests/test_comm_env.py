"""`labkit.comm.env` / `labkit comm env`: the source's NCCL/EFA template checked variable by variable."""
from __future__ import annotations

import json

import pytest

from labkit.cli import main
from labkit.comm import env
from labkit.comm.nccl_env_names import NCCL_NAMES
from labkit.paths import dataset


def _by_name(findings):
    return {f.name: f for f in findings}


def test_template_every_variable_flagged_with_its_source():
    got = _by_name(env.check_env(template=True))
    assert set(got) == {name for name, _ in env.SOURCE_TEMPLATE}
    assert got["NCCL_SOCKET_IFNAME"].verdict == "harmful" and "no IP" in got["NCCL_SOCKET_IFNAME"].advice
    assert got["NCCL_ALGO"].verdict == "harmful" and "AllGather and ReduceScatter" in got["NCCL_ALGO"].advice
    assert got["NCCL_ALGO"].debugging_only and got["NCCL_BUFFSIZE"].debugging_only
    for name in ("NCCL_NCHANNELS", "NCCL_THREADS"):
        assert got[name].verdict == "no effect" and not got[name].exists
    assert got["NCCL_NSOCKS_PERTHREAD"].verdict == "not needed" and "socket transport" in got[
        "NCCL_NSOCKS_PERTHREAD"].advice
    assert got["NCCL_IGNORE_CPU_AFFINITY"].verdict != "ok" and "availability zones" in got[
        "NCCL_IGNORE_CPU_AFFINITY"].advice
    assert got["RDMAV_FORK_SAFE"].verdict == "harmful" and got["RDMAV_FORK_SAFE"].component.startswith("rdma-core")
    assert got["FI_EFA_USE_DEVICE_RDMA"].component.startswith("libfabric")
    assert all(f.url.startswith("https://") for f in got.values())
    assert got["NCCL_ALGO"].url.endswith("env.html#nccl-algo")
    # worst first: the harmful ones lead the list
    assert [f.verdict for f in env.check_env(template=True)][:3] == ["harmful"] * 3


def test_clean_environment_says_defaults_apply(monkeypatch, capsys):
    for k in list(__import__("os").environ):
        if k.startswith(env.PREFIXES):
            monkeypatch.delenv(k)
    assert env.check_env() == [] and env.check_env({}) == []
    assert "defaults apply" in env.report([])
    assert main(["comm", "env"]) == 0
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    monkeypatch.setenv("PATH_LIKE_UNRELATED", "x")
    assert [(f.name, f.verdict) for f in env.check_env()] == [("NCCL_DEBUG", "ok")]


def test_names_come_from_nccl_source():
    assert {"NCCL_IB_HCA", "NCCL_MIN_CTAS", "NCCL_NTHREADS", "NCCL_SOCKET_NTHREADS", "NCCL_DEBUG_SUBSYS",
            "NCCL_P2P_LEVEL", "NCCL_BUFFSIZE"} <= NCCL_NAMES
    assert not {"NCCL_NCHANNELS", "NCCL_THREADS"} & NCCL_NAMES
    f = env.check_env({"NCCL_NCHANELS": "4", "NCCL_IB_HCA": "mlx5"})
    typo = _by_name(f)["NCCL_NCHANELS"]
    assert typo.verdict == "no effect" and "NCCL_MIN_NCHANNELS" in typo.advice
    assert _by_name(f)["NCCL_IB_HCA"].verdict == "ok"


@pytest.mark.parametrize("value, verdict", [("efa", "harmful"), ("=efa0", "harmful"), ("ens5", "ok"),
                                            ("^lo,docker", "ok"), ("^efa", "ok")])
def test_socket_ifname_values(value, verdict):
    assert env.check_env({"NCCL_SOCKET_IFNAME": value})[0].verdict == verdict


@pytest.mark.parametrize("value, verdict", [("Tree", "harmful"), ("tree", "harmful"), ("Ring", "debugging only"),
                                            ("^Tree", "debugging only"), ("allreduce:tree", "debugging only")])
def test_algo_values(value, verdict):
    assert env.check_env({"NCCL_ALGO": value})[0].verdict == verdict


def test_pasted_forms():
    text = """# a job script
export NCCL_DEBUG=INFO
NCCL_BUFFSIZE=8388608 python train.py
mpirun -np 16 -x NCCL_ALGO=Ring -x FI_PROVIDER -x LD_LIBRARY_PATH \\
  -genv NCCL_NSOCKS_PERTHREAD 4 python train.py
srun --export=ALL,NCCL_IB_HCA=mlx5,FI_EFA_USE_HUGE_PAGE=0 python train.py
node0:1:2 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1.
"""
    assert dict(env.parse_env_text(text)) == {
        "NCCL_DEBUG": "INFO", "NCCL_BUFFSIZE": "8388608", "NCCL_ALGO": "Ring", "FI_PROVIDER": None,
        "LD_LIBRARY_PATH": None, "NCCL_NSOCKS_PERTHREAD": "4", "NCCL_IB_HCA": "mlx5", "FI_EFA_USE_HUGE_PAGE": "0",
        "NCCL_IB_DISABLE": "1"}
    checked = {f.name for f in env.check_env(text)}
    assert "LD_LIBRARY_PATH" not in checked and "NCCL_IB_DISABLE" in checked


def test_an_nccl_info_log_reads_the_same_settings_as_the_log_parser():
    from labkit.comm import parse_nccl_debug

    text = dataset("comm", "nccl_debug_2node_25gbe.SYNTHETIC.log").read_text()
    assert dict(env.parse_env_text(text)) == parse_nccl_debug(text).env


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="mapping, pasted text or None"):
        env.check_env(5)
    with pytest.raises(ValueError, match="not an environment variable name"):
        env.check_env({"NCCL X": "1"})
    with pytest.raises(TypeError, match="value of NCCL_ALGO"):
        env.check_env({"NCCL_ALGO": 1})
    with pytest.raises(ValueError, match="not both"):
        env.check_env({}, template=True)
    with pytest.raises(ValueError, match="line 1"):
        env.parse_env_text("export NCCL_ALGO='Tree")


def test_cli(tmp_path, capsys):
    assert main(["comm", "env", "--template"]) == 1            # harmful / no-effect settings: exit 1
    out = capsys.readouterr().out
    assert "NCCL_SOCKET_IFNAME=efa  [harmful]" in out and "3 harmful, 2 no effect" in out
    assert all(len(line) <= 120 for line in out.splitlines())
    f = tmp_path / "job.sh"
    f.write_text("export NCCL_DEBUG=WARN\n")
    assert main(["comm", "env", str(f), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["verdict"] == "ok"
    assert main(["comm", "env", str(tmp_path / "missing.sh")]) == 2
    assert "missing.sh" in capsys.readouterr().err
