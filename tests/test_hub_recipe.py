"""The JupyterHub recipe (hub/): a dry run of the image and server config (no container daemon on CI).

The image is built for real only when asked (``LABKIT_BUILD_HUB_IMAGE=1`` and a reachable docker daemon).
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import tomllib
from _makefile import lab_flags
from traitlets.config import Config

from labkit.paths import repo_root

ROOT = repo_root()
HUB = ROOT / "hub"


def _dockerfile() -> list[tuple[str, str]]:
    """(instruction, argument) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (HUB / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _server_config() -> Config:
    cfg = Config()
    exec(compile((HUB / "jupyter_server_config.py").read_text(), "jupyter_server_config.py", "exec"),
         {"get_config": lambda: cfg})
    return cfg


def test_image_pins_the_bootstrap_torch_installs_the_lab_extra_and_leaves_the_course_read_only():
    steps = _dockerfile()
    kinds = [k for k, _ in steps]
    assert kinds[0] == "FROM" and "python-3.1" in steps[0][1]
    args = dict(a.split("=", 1) for k, a in steps if k == "ARG")
    boot = re.search(r"TORCH_VERSION=\$\{LABKIT_TORCH_VERSION:-([\d.]+)\}", (ROOT / "scripts/bootstrap.sh").read_text())
    assert args["TORCH_VERSION"] == boot.group(1), "the image's torch differs from scripts/bootstrap.sh"
    assert args["TORCH_INDEX"].startswith("cu")
    run = " ".join(a for k, a in steps if k == "RUN")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    installed = re.findall(r'"/opt/labkit\[(\w+)\]"', run)
    assert installed and all(e in extras for e in installed)
    assert 'torch==${TORCH_VERSION}' in run and "download.pytorch.org/whl/${TORCH_INDEX}" in run
    assert "chmod -R a-w /opt/labkit" in run                 # learners cannot write into the course
    env = dict(a.split("=", 1) for k, a in steps if k == "ENV")
    assert env["LABKIT_ROOT"] == "/opt/labkit"
    for k, a in steps:
        if k == "COPY" and "--from=" not in a:          # from the build context (not from another stage)
            src = [p for p in a.split() if not p.startswith("--")][0]
            assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
    # the image brings a CJK font (the course's Chinese titles); figures must not need one (tests/test_viz_fonts.py)
    assert re.search(r"apt-get install[^&]*fonts-noto-cjk", run)
    users = [a for k, a in steps if k == "USER"]
    assert users[-1] == "${NB_UID}", "the learner's server must not run as root"


def test_server_config_opens_the_index_and_matches_make_course():
    cfg = _server_config()
    url = cfg.LabApp.default_url
    assert url.startswith("/lab/tree/labkit/")
    assert (ROOT / url.removeprefix("/lab/tree/labkit/")).is_file(), f"{url} is not a notebook of the course"
    flags = lab_flags()
    assert flags["LabApp.default_url"].removeprefix("/lab/tree/") == url.removeprefix("/lab/tree/labkit/")
    for trait in ("cull_idle_timeout", "cull_interval"):
        assert int(flags[f"MappingKernelManager.{trait}"]) == cfg.MappingKernelManager[trait] > 0
    assert cfg.MappingKernelManager.cull_connected is False     # never cull a kernel a tab still shows


def test_readme_commands_name_real_subcommands_and_options():
    from labkit.cli import build_parser

    text = (HUB / "README.md").read_text()
    parser = build_parser()
    for cmd in re.findall(r"^labkit (.+)$", text, flags=re.M):
        argv = shlex.split(cmd.split("#")[0])
        with pytest.raises(SystemExit) as e:               # --help of the subcommand: exists, parses
            parser.parse_args([argv[0], "--help"])
        assert e.value.code == 0, cmd
        opts = [a.split("=")[0] for a in argv if a.startswith("--")]
        sub = parser._subparsers._group_actions[0].choices[argv[0]]
        known = {o for a in sub._actions for o in a.option_strings}
        assert set(opts) <= known, f"{cmd}: unknown options {set(opts) - known}"


def _daemon() -> bool:
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("LABKIT_BUILD_HUB_IMAGE") != "1" or not _daemon(),
                    reason="set LABKIT_BUILD_HUB_IMAGE=1 on a machine with a docker daemon to build the image")
def test_cpu_image_builds_and_imports_labkit():
    tag = "labkit-course:test-cpu"
    subprocess.run(["docker", "build", "-f", "hub/Dockerfile", "--build-arg", "TORCH_INDEX=cpu", "-t", tag, "."],
                   cwd=ROOT, check=True, timeout=3600)
    out = subprocess.run(["docker", "run", "--rm", tag, "python", "-c",
                          "import labkit, torch; from labkit import paths; print(paths.work_dir())"],
                         capture_output=True, text=True, check=True, timeout=600).stdout
    assert "/home/" in out and "/opt/labkit" not in out


def _hub_config() -> Config:
    cfg = Config()
    path = HUB / "jupyterhub_config.py"
    exec(compile(path.read_text(), str(path), "exec"), {"get_config": lambda: cfg, "__file__": str(path)})
    return cfg


def _stages() -> dict[str, list[tuple[str, str]]]:
    """{stage name: its instructions}, from hub/Dockerfile."""
    out, name = {}, None
    for k, a in _dockerfile():
        if k == "FROM":
            name = a.split(" AS ")[-1].strip() if " AS " in a else a
            out[name] = []
        out[name].append((k, a))
    return out


def test_one_machine_hub_stage_runs_the_shared_hub_config():
    """hub/Dockerfile's `hub` target starts the very file tests/test_hub_live.py starts, with the proxy and
    JupyterHub installed, the instructor sources root only and the base stage's CJK font."""
    stages = _stages()
    hub = stages["hub"]
    assert hub[0][1].startswith("base AS"), "the hub stage builds on the base stage (torch, labkit, CJK font)"
    assert any(k == "RUN" and "fonts-noto-cjk" in a for k, a in stages["base"])
    run = " ".join(a for k, a in hub if k == "RUN")
    assert "configurable-http-proxy" in run and re.search(r"pip install[^&]*jupyterhub", run)
    assert "chmod -R go-rwx /opt/labkit/labs" in run and "chmod -R a-w /opt/labkit" in run
    cmd = [a for k, a in hub if k == "CMD"][-1]
    assert cmd == '["jupyterhub", "-f", "/opt/labkit/hub/jupyterhub_config.py"]'   # /opt/labkit = the checkout
    assert not [a for k, a in hub if k == "USER"], "JupyterHub runs as root (PAM, one account per learner)"
    env = dict(a.split("=", 1) for k, a in hub if k == "ENV")
    assert env["LABKIT_COURSE_TREE"] == "/opt/labkit/course"


def test_hub_config_spawns_each_learner_on_the_course_server_config():
    cfg = _hub_config()
    assert cfg.JupyterHub.authenticator_class == "pam" and cfg.JupyterHub.spawner_class == "localprocess"
    assert cfg.LocalAuthenticator.allowed_groups == {"learners"}
    assert cfg.LocalAuthenticator.create_system_users is False
    assert cfg.Spawner.notebook_dir == "~"
    assert cfg.Spawner.default_url == _server_config().LabApp.default_url   # the course index of ~/labkit
    # the single-user servers read hub/jupyter_server_config.py (working copy, culling) and see the course
    assert (Path(cfg.Spawner.environment["JUPYTER_CONFIG_PATH"]) / "jupyter_server_config.py").is_file()
    assert {"LABKIT_COURSE_TREE", "LABKIT_ROOT", "PATH"} <= set(cfg.Spawner.env_keep)


def test_hub_scripts_are_executable_and_named_in_the_readme():
    text = (HUB / "README.md").read_text()
    for name in ("add-learner.sh", "collect.sh", "return-feedback.sh"):
        assert os.access(HUB / name, os.X_OK), f"hub/{name} is not executable"
        assert f"hub/{name}" in text
        r = subprocess.run(["bash", "-n", str(HUB / name)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    assert "-K HOME_MODE=0700" in (HUB / "add-learner.sh").read_text()   # Debian's useradd default is 0755
