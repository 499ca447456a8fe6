"""A real JupyterHub with the course, started from hub/jupyterhub_config.py (the file hub/Dockerfile's ``hub``
target runs), driven in headless Chromium: two learners and the instructor, on this machine.

JupyterHub (the project venv, dev extras) with configurable-http-proxy (npm, installed into the git-ignored
``build/hub/node``), PAM log-in, LocalProcessSpawner. The test, as root, makes a learners group and two real
system accounts with hub/add-learner.sh (home 0700, password) and removes them afterwards, failure or not,
with every process they ran. Asserted:

- each learner logs in with their password and lands on the course index of their own working copy
  ``~/labkit``, made from the released course tree (``labkit release --course-tree``, no solutions);
- learner A runs chapter 3 (Run All: no error output, its figures drawn) and answers lab 1's q1; learner B
  answers q2 wrongly; both save;
- learner B's browser cannot open A's server; as B's account, A's files, A's feedback, the submissions and the
  instructor sources cannot be read; each server runs as its learner's account;
- the instructor collects (hub/collect.sh), grades with ``labkit grade`` (A: q1 full marks; B: q1 and q2
  nothing) and returns the feedback (hub/return-feedback.sh), which learner A opens in the browser.

Screenshots go to ``build/hub/shots/``. Skipped, with the reason, without root, useradd/chpasswd/runuser,
npm (or its registry), Chromium or playwright. The project's interpreter must be reachable by the learners'
accounts: where it lies below a folder only root may enter (pyenv under /root), the test lets its learners
group traverse that folder (group search bit) for its duration and restores owner group and mode after (a
run killed before that is repaired by the next run, from ``build/hub/restore-<pid>.json``).

On this test machine the checkout itself (the instructor's ``labs/`` included) is readable by every account;
what is checked is what the recipe controls: the course tree and the instructor copy the hub serves and grades.
"""
from __future__ import annotations

import csv
import grp
import json
import os
import pwd
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from labkit.paths import repo_root

ROOT = repo_root()
HUB = ROOT / "hub"
NODE_DIR = ROOT / "build" / "hub" / "node"
SHOTS = ROOT / "build" / "hub" / "shots"
CHP_VERSION = "5"              # configurable-http-proxy major version (npm)
LAB = "lab01_baseline"
CHAPTER = "chapters/part1_cognition/ch03_counting_flops.ipynb"
sys.path.insert(0, str(ROOT / "scripts"))
import jlab  # noqa: E402  (scripts/jlab.py: the page steps shared with tests/test_browser.py)
from _procs import stop_group  # noqa: E402  (tests/_procs.py: shared with tests/test_browser.py)

CHROMIUM = os.environ.get("LABKIT_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
Q1_ANSWER = """record = None
baseline_path = OUT / "baseline.json"
cfg = TrainConfig(model=MODEL_SIZE, seq_len=SEQ_LEN, micro_batch=MICRO_BATCH, steps=STEPS,
                  warmup_steps=WARMUP, seed=SEED, device=DEVICE, label="baseline")
record = train(cfg)
record.save(baseline_path)
if record is not None:
    print(record.summary())
book.submit("q1", answer=str(baseline_path) if record is not None else None, record=record,
            files=[baseline_path] if baseline_path.exists() else [])"""
PREFIX = "lkhub"                # the test's group is lkhub<pid>, its learners lk<pid>a / lk<pid>b

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.hub, pytest.mark.timeout(1200)]   # ~12 min at load 30 on 2 cores


def _missing() -> str | None:
    """Why this machine cannot run the hub (None when it can)."""
    if os.geteuid() != 0:
        return "needs root: it creates system accounts for two learners (run the suite as root in a container)"
    for tool in ("useradd", "userdel", "groupadd", "groupdel", "chpasswd", "runuser"):
        if shutil.which(tool) is None:
            return f"no `{tool}` on this machine (the hub's learners are system accounts)"
    if CHROMIUM is None:
        return "no Chromium: `apt-get install chromium` (or set LABKIT_CHROMIUM)"
    for mod in ("playwright.sync_api", "jupyterhub", "pamela"):
        try:
            __import__(mod)
        except ImportError:
            return f"{mod} is not installed (labkit's dev extras: scripts/bootstrap.sh dev)"
    return None


def _proxy_bin() -> Path:
    """configurable-http-proxy from npm, installed once into build/hub/node (git-ignored)."""
    exe = NODE_DIR / "node_modules" / ".bin" / "configurable-http-proxy"
    if not exe.exists():
        if shutil.which("npm") is None or shutil.which("node") is None:
            pytest.skip("no npm/node: JupyterHub's proxy (configurable-http-proxy) comes from the npm registry")
        NODE_DIR.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(NODE_DIR),
                            f"configurable-http-proxy@{CHP_VERSION}"], capture_output=True, text=True, timeout=300)
        if r.returncode != 0 or not exe.exists():
            pytest.skip(f"npm could not install configurable-http-proxy (registry unreachable?): {r.stderr[-500:]}")
    return exe


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=kw.pop("timeout", 60), **kw)


def _as(user: str, *cmd: str) -> subprocess.CompletedProcess:
    return _run(["runuser", "-u", user, "--", *cmd])


def _alive(pid: int) -> bool:
    return psutil.pid_exists(pid)


def _kill_uids(uids: set[int], timeout: float = 15) -> None:
    """SIGKILL every process running as one of ``uids`` until none is left."""
    t_end = time.time() + timeout
    while time.time() < t_end:
        procs = [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real in uids]
        if not procs:
            return
        for p in procs:
            try:
                p.kill()
            except psutil.Error:
                pass
        time.sleep(0.3)


def _restore_modes(marker: Path) -> None:
    for d, mode, gid in json.loads(marker.read_text()):
        try:
            os.chown(d, -1, gid)
            os.chmod(d, mode)
        except FileNotFoundError:
            pass
    marker.unlink()


def _remove_group(group: str) -> None:
    """Remove the test group ``group``, its members (their processes, homes, mail) and the group."""
    try:
        members = grp.getgrnam(group).gr_mem
    except KeyError:
        return
    uids = set()
    for m in members:
        try:
            uids.add(pwd.getpwnam(m).pw_uid)
        except KeyError:
            pass
    _kill_uids(uids)
    for m in members:
        _run(["userdel", "--remove", m])
    _run(["groupdel", group])


def _clean_stale() -> None:
    """Undo what a run killed before its finalizers left behind (its pid no longer lives)."""
    for g in grp.getgrall():
        if re.fullmatch(rf"{PREFIX}\d+", g.gr_name) and not _alive(int(g.gr_name[len(PREFIX):])):
            _remove_group(g.gr_name)
    for marker in (ROOT / "build" / "hub").glob("restore-*.json"):
        if not _alive(int(marker.stem.split("-")[1])):
            _restore_modes(marker)


def _grant_traverse(paths: list[Path], group: str, marker: Path) -> None:
    """Let ``group`` enter every folder above ``paths`` that others may not enter (group search bit, group
    owner ``group``), recording what to restore in ``marker``. Only folders whose group has no rights at all."""
    gid = grp.getgrnam(group).gr_gid
    todo = []
    for p in paths:
        for d in [p, *p.parents] if p.is_dir() else p.parents:
            st = d.stat()
            if st.st_mode & 0o001 or (d, st.st_mode & 0o7777, st.st_gid) in todo:
                continue
            if st.st_mode & 0o070:
                pytest.skip(f"the learners cannot enter {d} (mode {st.st_mode & 0o777:o}, group {st.st_gid}), which "
                            "holds the project's interpreter, and the test does not change a folder's group rights")
            todo.append((d, st.st_mode & 0o7777, st.st_gid))
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps([(str(d), mode, g) for d, mode, g in todo]))
    for d, mode, _ in todo:
        os.chown(d, -1, gid)
        os.chmod(d, mode | 0o010)


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def learners(tmp_path):
    """The learners group and two accounts made by hub/add-learner.sh; yields {login: password}."""
    why = _missing()
    if why:
        pytest.skip(why)
    _clean_stale()
    group = f"{PREFIX}{os.getpid()}"
    accounts = {f"lk{os.getpid()}{s}": secrets.token_urlsafe(12) for s in "ab"}
    marker = ROOT / "build" / "hub" / f"restore-{os.getpid()}.json"
    try:
        lines = "".join(f"{u}:{p}\n" for u, p in accounts.items())
        r = _run([str(HUB / "add-learner.sh")], input=lines, env=dict(os.environ, LABKIT_HUB_LEARNERS=group))
        assert r.returncode == 0, r.stderr
        for u in accounts:
            assert os.stat(pwd.getpwnam(u).pw_dir).st_mode & 0o777 == 0o700, f"{u}'s home is readable by others"
        _grant_traverse([Path(os.path.realpath(sys.executable)), Path(sys.base_prefix), Path(sys.prefix), ROOT],
                        group, marker)
        first = next(iter(accounts))
        r = _as(first, sys.executable, "-c", "import labkit, jupyterhub, torch")
        assert r.returncode == 0, f"a learner's account cannot run the project's interpreter: {r.stderr[-800:]}"
        yield group, accounts
    finally:
        _remove_group(group)
        if marker.exists():
            _restore_modes(marker)
    for u in accounts:
        with pytest.raises(KeyError):
            pwd.getpwnam(u)


@pytest.fixture
def hub(learners, tmp_path):
    """JupyterHub from hub/jupyterhub_config.py on free ports; yields (url, group, accounts, course tree, log)."""
    group, accounts = learners
    chp = _proxy_bin()
    shared = Path(tempfile.mkdtemp(prefix="labkit-hub-course-"))      # learners must read the course tree
    os.chmod(shared, 0o755)
    state = tmp_path / "hub-state"                                     # root's only: database, cookie secret
    state.mkdir(mode=0o700)
    log = tmp_path / "jupyterhub.log"
    proc = None
    ports = _free_ports(3)
    try:
        tree = shared / "course"
        r = _run([sys.executable, "-m", "labkit", "release", "--course-tree", str(tree)], timeout=180)
        assert r.returncode == 0, r.stderr
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LABKIT_", "JUPYTER"))}
        env.update(PATH=os.pathsep.join([str(Path(sys.executable).parent), str(chp.parent), env.get("PATH", "")]),
                   LABKIT_HUB_LEARNERS=group, LABKIT_COURSE_TREE=str(tree), LABKIT_ROOT=str(ROOT))
        cmd = [sys.executable, "-m", "jupyterhub", "-f", str(HUB / "jupyterhub_config.py"),
               f"--JupyterHub.bind_url=http://127.0.0.1:{ports[0]}",
               f"--JupyterHub.hub_bind_url=http://127.0.0.1:{ports[1]}",
               f"--ConfigurableHTTPProxy.api_url=http://127.0.0.1:{ports[2]}"]
        with open(log, "w") as out:
            proc = subprocess.Popen(cmd, cwd=state, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        t_end = time.time() + 120
        while "JupyterHub is now running" not in log.read_text():
            if proc.poll() is not None or time.time() > t_end:
                pytest.fail(f"JupyterHub did not start (exit {proc.poll()}):\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield f"http://127.0.0.1:{ports[0]}", group, accounts, tree, log
    finally:
        uids = {pwd.getpwnam(u).pw_uid for u in accounts}
        if proc is not None:
            below = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)] if proc.poll() is None else []
            proxy_pid = state / "jupyterhub-proxy.pid"
            if proxy_pid.exists() and proxy_pid.read_text().strip().isdigit():
                below.append(int(proxy_pid.read_text()))
            # SIGTERM to the hub alone (it stops the learners' servers and the proxy), then SIGKILL to what is left
            stop_group(proc, grace_s=40, also=below, term_leader_only=True)
        _kill_uids(uids)
        shutil.rmtree(shared, ignore_errors=True)
    left = [p for p in ports if _listening(p)]
    assert not left, f"ports still listened on after the hub stopped: {left}"


def _login(page, url: str, user: str, password: str) -> None:
    page.goto(f"{url}/hub/login")
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", password)
    page.click("input[type=submit], button[type=submit]")


def _wait_lab(page, timeout_s: float = 300) -> None:
    """Wait until the visible notebook has rendered (no loading spinner) and its kernel is idle."""
    page.wait_for_selector(f"{jlab.VISIBLE} .jp-Cell", timeout=timeout_s * 1000)
    page.wait_for_selector(f"{jlab.VISIBLE} .jp-Spinner", state="detached", timeout=timeout_s * 1000)
    page.wait_for_selector(".jp-StatusBar-Widget >> text=/Python 3.*Idle/", timeout=timeout_s * 1000)


def _open(page, url: str, user: str, rel: str) -> None:
    page.goto(f"{url}/user/{user}/lab/tree/labkit/{rel}")
    _wait_lab(page, 120)
    time.sleep(2)                                   # the kernel connects; the menu's commands enable


def _answer(page, marker: str, source: str) -> None:
    """Replace the whole source of the code cell that shows ``marker`` with ``source`` and save the notebook."""
    cell = page.locator(f"{jlab.VISIBLE} .jp-CodeCell").filter(has_text=marker).first
    cell.locator(".cm-content").click()
    page.keyboard.press("Control+a")
    page.keyboard.insert_text(source)
    page.keyboard.press("Control+s")
    page.wait_for_function("() => !document.querySelector('.lm-TabBar-tab.lm-mod-current.jp-mod-dirty')",
                           timeout=30_000)


def _errors(page) -> list[str]:
    out = page.locator(f"{jlab.VISIBLE} .jp-OutputArea-output").filter(
        has_text=re.compile(r"Traceback \(most recent call last\)"))
    return [out.nth(i).inner_text()[-1500:] for i in range(out.count())]


def test_two_learners_and_the_instructor_on_a_real_hub(hub, tmp_path):
    from playwright.sync_api import sync_playwright

    from labkit.teaching.grading.course_copy import leaks

    url, group, accounts, tree, log = hub
    a, b = accounts
    SHOTS.mkdir(parents=True, exist_ok=True)
    assert leaks(tree) == [], "the released course tree holds solution or hidden-check code"
    instructor = tmp_path / "instructor"              # the instructor's sources, root only (as the hub image)
    shutil.copytree(ROOT / "labs" / LAB, instructor / "labs" / LAB)
    os.chmod(instructor, 0o700)
    t0 = time.perf_counter()
    with sync_playwright() as p:
        browser = p.chromium.launch(headless=True, executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            ctx = {u: browser.new_context(viewport={"width": 1400, "height": 1000}) for u in accounts}
            page = {u: ctx[u].new_page() for u in accounts}
            # 1. both log in with their system passwords; their servers start side by side
            for u, pw in accounts.items():
                _login(page[u], url, u, pw)
            for u in accounts:
                _wait_lab(page[u])
                assert page[u].url.endswith(f"/user/{u}/lab/tree/labkit/chapters/index.ipynb"), page[u].url
                current = page[u].locator(".lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel").all_text_contents()
                assert "index.ipynb" in current, f"{u} landed on {current}, not the course index"
                time.sleep(2)           # a notebook that changes on load is marked dirty within a moment
                dirty = page[u].eval_on_selector_all(".lm-TabBar-tab.jp-mod-dirty", "els => els.map(e => e.textContent)")
                assert dirty == [], f"{u}'s course index opened already modified: {dirty}"
                page[u].screenshot(path=str(SHOTS / f"01_{u[-1]}_index.png"))
            started = time.perf_counter() - t0

            # 2. learner A runs chapter 3 (Run All, as a learner would) ...
            _open(page[a], url, a, CHAPTER)
            jlab.menu(page[a], "Edit", "editmenu:clear-all")
            jlab.menu(page[a], "Run", "runmenu:run-all")
            # ... while learner B answers q2 of lab 1 (wrongly) and saves
            _open(page[b], url, b, f"labs/{LAB}/{LAB}.ipynb")
            _answer(page[b], 'book.submit("q2"', 'answer_q2 = 2.0\nbook.submit("q2", answer=answer_q2)')
            page[b].screenshot(path=str(SHOTS / "02_b_lab_answered.png"))
            # B's browser cannot reach A's server (the hub refuses B's token for it)
            r = ctx[b].request.get(f"{url}/user/{a}/api/contents/labkit/labs/{LAB}")
            assert r.status == 403 and LAB not in r.text(), (r.status, r.text()[:300])

            page[a].bring_to_front()
            page[a].wait_for_function(
                f"""() => {{ const nb = document.querySelector('{jlab.VISIBLE}');
                           const busy = [...nb.querySelectorAll('.jp-InputPrompt')].some(p => p.textContent.includes('*'));
                           const ind = nb.querySelector('.jp-Notebook-ExecutionIndicator');
                           return !busy && ind && ind.getAttribute('data-status') === 'idle'; }}""",
                timeout=300_000, polling=2000)
            page[a].screenshot(path=str(SHOTS / "03_a_ch03_after_run_all.png"))
            assert _errors(page[a]) == [], "an error output after Run All of chapter 3:\n" + "\n".join(_errors(page[a]))
            figures = page[a].locator(f"{jlab.VISIBLE} .jp-OutputArea-output img").count()
            assert figures >= 2, f"chapter 3 drew {figures} figure(s)"
            done = page[a].locator(f"{jlab.VISIBLE} .jp-OutputArea-output").filter(has_text="chapter 3 done:")
            assert done.count() == 1, "chapter 3's last cell (its checks) did not print its line"

            # 3. learner A answers q1 of lab 1 and saves
            _open(page[a], url, a, f"labs/{LAB}/{LAB}.ipynb")
            _answer(page[a], "YOUR ANSWER HERE", Q1_ANSWER)
            page[a].screenshot(path=str(SHOTS / "04_a_lab_answered.png"))

            # 4. what each account may read
            home = {u: Path(pwd.getpwnam(u).pw_dir) for u in accounts}
            mine = home[a] / "labkit" / "labs" / LAB / f"{LAB}.ipynb"
            assert "TrainConfig(model=MODEL_SIZE" in mine.read_text(), "A's answer was not saved to ~/labkit"
            assert "BEGIN SOLUTION" not in mine.read_text()
            assert _as(b, "cat", str(mine)).returncode != 0, "learner B read learner A's lab"
            assert _as(b, "ls", str(home[a])).returncode != 0, "learner B listed learner A's home"
            assert _as(a, "cat", str(instructor / "labs" / LAB / f"{LAB}.ipynb")).returncode != 0, \
                "a learner read the instructor's source"
            servers = {u: [pr for pr in psutil.process_iter(["cmdline", "uids"])
                           if "jupyterhub-singleuser" in " ".join(pr.info["cmdline"] or [])
                           and pr.info["uids"].real == pwd.getpwnam(u).pw_uid] for u in accounts}
            assert all(servers.values()), f"each server runs as its learner's account: {servers}"

            # 5. the instructor collects, grades and returns the feedback (root, hub/README.md)
            env = dict(os.environ, LABKIT_HUB_LEARNERS=group)
            subs, grades = tmp_path / "submitted", tmp_path / "grades"
            r = _run([str(HUB / "collect.sh"), LAB, str(subs)], env=env)
            assert r.returncode == 0 and sorted(p.name for p in subs.iterdir()) == sorted(accounts), r.stderr
            assert _as(b, "ls", str(subs)).returncode != 0, "a learner listed the submissions"
            t_grade = time.perf_counter()
            r = _run([sys.executable, "-m", "labkit", "grade", str(instructor / "labs" / LAB), str(subs),
                      "--out", str(grades), "--workers", "2", "--param", "FAST=True", "--no-progress"], timeout=420)
            t_grade = time.perf_counter() - t_grade
            assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
            rows = {row["student"]: row for row in csv.DictReader(open(grades / "gradebook.csv"))}
            assert set(rows) == set(accounts), rows
            assert float(rows[a]["q1"]) == 3, rows[a]
            assert float(rows[b]["q1"]) == 0 and float(rows[b]["q2"]) == 0, rows[b]
            assert float(rows[a]["score"]) > float(rows[b]["score"])
            r = _run([str(HUB / "return-feedback.sh"), LAB, str(grades)], env=env)
            assert r.returncode == 0, r.stderr
            back = home[a] / "labkit" / "feedback" / f"{LAB}.md"
            assert back.stat().st_uid == pwd.getpwnam(a).pw_uid and back.stat().st_mode & 0o077 == 0
            assert back.read_text() == (grades / "feedback" / f"{a}.md").read_text()
            assert _as(b, "cat", str(back)).returncode != 0, "learner B read learner A's feedback"

            # 6. learner A reads the feedback in the browser
            page[a].goto(f"{url}/user/{a}/lab/tree/labkit/feedback/{LAB}.md")
            page[a].wait_for_selector(f".lm-TabBar-tab.lm-mod-current:has-text('{LAB}.md')", timeout=120_000)
            score = f"Score: {float(rows[a]['score']):g} / {float(rows[a]['max_score']):g}"
            page[a].locator(".jp-FileEditor .cm-content:visible").filter(has_text=score).wait_for(timeout=60_000)
            page[a].screenshot(path=str(SHOTS / "05_a_feedback.png"))
        finally:
            browser.close()
    took = time.perf_counter() - t0
    print(f"hub test: servers ready {started:.0f} s, grading {t_grade:.0f} s, whole browser part {took:.0f} s")
