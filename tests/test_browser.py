"""The course in a real browser: JupyterLab as `make course` starts it, driven by headless Chromium.

What a newcomer meets in the first minutes, asserted: the URL JupyterLab prints opens the course index;
no notebook opens already modified (a notebook missing metadata is marked dirty and asks "Save
changes?" on close); the index's link opens chapter 4; Run All finishes without an error output and draws
its figure; the MFU / HFU calculator starts exactly on its own static table's values, and moving a slider
changes its result.

Needs Debian's ``chromium`` (or ``$LABKIT_CHROMIUM``) and the ``playwright`` package (in the dev extras; no
browser download): skipped, with the reason, where either is missing. The course is served from a copy
of ``chapters/`` and ``labs/``, so running cells never touches the checkout's notebooks.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from _makefile import lab_flags
from _procs import stop_group

from labkit.paths import repo_root

ROOT = repo_root()
sys.path.insert(0, str(ROOT / "scripts"))
import jlab  # noqa: E402  (scripts/jlab.py: the page steps shared with scripts/try_in_browser.py)

CHROMIUM = os.environ.get("LABKIT_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
RUN_ALL_TIMEOUT_S = 900          # chapter 4 with the learner's parameters, on a loaded 2-core machine

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def _served_copy(dest: Path) -> Path:
    """What `make course` serves: the released course (chapters, labs without solutions) written to ``dest``."""
    from labkit.teaching.grading.course_copy import release_course

    return release_course(dest)


@pytest.fixture
def course_server(tmp_path):
    """JupyterLab with the Makefile's flags on a copy of the course; yields (printed URL, log path)."""
    if CHROMIUM is None:
        pytest.skip("no Chromium: `apt-get install chromium` (or set LABKIT_CHROMIUM) to run the browser test")
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright; "
                                                      "it is in labkit's dev extras)")
    served = _served_copy(tmp_path / "course")
    state = tmp_path / "jupyter-state"
    settings = state / "settings" / "@jupyterlab" / "docmanager-extension"
    settings.mkdir(parents=True)
    (settings / "plugin.jupyterlab-settings").write_text('{"autosave": false}')   # never write the copy back
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(state / "runtime"), JUPYTERLAB_SETTINGS_DIR=str(state / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(state / "workspaces"), LABKIT_ROOT=str(ROOT),
               LABKIT_WORK=str(tmp_path / "work"))
    port = jlab.free_port()
    flags = {**lab_flags(), "ServerApp.root_dir": str(served)}
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", *(f"--{k}={v}" for k, v in flags.items()),
           "--IdentityProvider.token=", "--ServerApp.password=", "--ServerApp.ip=127.0.0.1",
           f"--ServerApp.port={port}", "--ServerApp.port_retries=0"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")     # as `make course` adds for root in a container
    log = tmp_path / "jupyter.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=served, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        url, t_end = None, time.time() + 120
        while url is None and time.time() < t_end:
            if proc.poll() is not None:
                pytest.fail(f"jupyter lab exited with code {proc.returncode}:\n{log.read_text()[-3000:]}")
            m = re.search(rf"(http://127\.0\.0\.1:{port}/\S*)", log.read_text())
            url = m.group(1) if m else None
            time.sleep(0.5)
        assert url, f"JupyterLab printed no URL in 120 s:\n{log.read_text()[-3000:]}"
        urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=30)
        yield url, log
    finally:
        stop_group(proc)


def _dirty_tabs(page) -> list[str]:
    time.sleep(3)                 # a notebook that changes on load is marked within a moment
    return page.eval_on_selector_all(".lm-TabBar-tab.jp-mod-dirty", "els => els.map(e => e.textContent)")


def _values(text: str, names: tuple[str, ...]) -> dict[str, str]:
    """{name: value} from 'MFU: 0.3805' (the widget's line) or a table row's columns."""
    return {n: m.group(1) for n in names if (m := re.search(rf"\b{n}\s*:\s*(\S+)", text))}


def test_the_course_in_a_browser(course_server, tmp_path):
    from playwright.sync_api import sync_playwright

    url, _log = course_server
    shots = tmp_path / "shots"
    shots.mkdir()
    with sync_playwright() as p:
        browser = p.chromium.launch(headless=True, executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            # 1. the URL JupyterLab prints opens the course index, unmodified
            page.goto(url)
            page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=120_000)
            jlab.wait_kernel_idle(page, 120)
            current = page.locator(".lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel").all_text_contents()
            assert "index.ipynb" in current, f"the printed URL {url} opened {current}, not the course index"
            assert _dirty_tabs(page) == [], "the index opened already modified (incomplete notebook metadata?)"

            # 2. the index's link opens chapter 4, unmodified
            page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) a[href*='ch04_mfu_hfu.ipynb']").first.click()
            page.wait_for_selector(".lm-TabBar-tab:has-text('ch04_mfu_hfu.ipynb')", timeout=60_000)
            page.wait_for_selector(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell", timeout=60_000)
            jlab.wait_kernel_idle(page, 120)
            assert _dirty_tabs(page) == [], "chapter 4 opened already modified"

            # 3. Run All with the learner's parameters: no error output, the figure drawn, the last check passes
            jlab.run_all(page, RUN_ALL_TIMEOUT_S, clear_first=True)
            panel = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
            page.screenshot(path=str(shots / "ch04_after_run_all.png"))
            errors = panel.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.error']")
            assert errors.count() == 0, "an error output after Run All:\n" + "\n".join(
                errors.nth(i).inner_text()[-1500:] for i in range(errors.count()))
            assert panel.locator(".jp-OutputArea-output img").count() >= 1, "no figure was drawn"
            done = panel.locator(".jp-OutputArea-output").filter(has_text=re.compile(r"chapter 4 done: live MFU"))
            assert done.count() == 1, "the last cell's check did not print its line"

            # 4. the calculator starts on its own table's values, and a slider moves its result
            box = panel.locator(".widget-vbox").filter(has_text="MFU / HFU calculator").first
            box.scroll_into_view_if_needed()
            result = box.locator(".widget-html").last
            first = _values(result.inner_text(), ("MFU", "HFU"))
            table = panel.locator("table.dataframe").filter(has_text="defaults").first   # the static table (HTML)
            head = None
            for _ in range(60):     # a loaded machine renders the table's rows after the box: read until it has them
                lines = [ln.split("\t") if "\t" in ln else ln.split() for ln in table.inner_text().splitlines()]
                head = next((cols for cols in lines if "MFU" in cols and "HFU" in cols), None)   # tab-separated
                if head is not None:
                    break
                page.wait_for_timeout(500)
            assert head is not None, f"the calculator's defaults table has no MFU/HFU header: {lines[:3]}"
            row = next(cols for cols in lines if cols and cols[0].strip() == "defaults")
            mfu_col, hfu_col = (row[head.index(k) - len(head) + len(row)].strip() for k in ("MFU", "HFU"))
            assert first == {"MFU": mfu_col, "HFU": hfu_col}, (
                f"the calculator starts at {first}, its table says MFU {mfu_col}, HFU {hfu_col}")
            handle = box.locator(".widget-slider").first.locator(".noUi-handle").first
            before = result.inner_text()
            handle.focus()
            for _ in range(5):
                page.keyboard.press("ArrowLeft")
            page.wait_for_function("([el, before]) => el.innerText !== before",
                                   arg=[result.element_handle(), before], timeout=30_000)
            moved = _values(result.inner_text(), ("MFU",))
            assert moved.get("MFU") and moved["MFU"] != first["MFU"], (first, result.inner_text())
            assert float(moved["MFU"]) < float(first["MFU"]), "fewer tokens/s must give a lower MFU"
            box.screenshot(path=str(shots / "ch04_calculator_moved.png"))

            # 5. two more chapters and a lab, opened by their URLs in a fresh page, are not marked modified either
            base = url.split("/lab", 1)[0]
            fresh = browser.new_page(viewport={"width": 1400, "height": 1000})
            for rel in ("chapters/part3_tuning/ch16_attention_kernels.ipynb",
                        "chapters/part4_case_review/ch30_case_bert_checklist.ipynb",
                        "labs/lab09_collectives/lab09_collectives.ipynb"):
                name = rel.rsplit("/", 1)[1]
                fresh.goto(f"{base}/lab/tree/{rel}")
                fresh.wait_for_selector(f".lm-TabBar-tab:has-text('{name}')", timeout=120_000)
                fresh.wait_for_selector(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell", timeout=120_000)
                jlab.wait_kernel_idle(fresh, 120)
                assert name not in " ".join(_dirty_tabs(fresh)), f"{rel} opened already modified"
        finally:
            browser.close()
