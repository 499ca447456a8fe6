#!/usr/bin/env python3
"""Try the course as a newcomer would, in a real (headless) browser.

clean clone -> ``scripts/bootstrap.sh lab`` and ``labkit release --course my-course`` (what ``make course``
runs) -> JupyterLab serving ``my-course/`` on a free port on 127.0.0.1 -> Chromium -> ``chapters/index.ipynb``
(the released labs it links to must hold no solution) -> click the index's link to chapter 4 -> Run All Cells ->
wait -> screenshots of the live-run MFU cell, the calculator, and anything that went wrong.

Needs Playwright in the Python that runs this script (not in the course's .venv), e.g.::

    python3 -m venv /tmp/pw-venv && /tmp/pw-venv/bin/pip install playwright
    apt-get install -y chromium            # or: /tmp/pw-venv/bin/playwright install chromium
    /tmp/pw-venv/bin/python scripts/try_in_browser.py --overlay --shots /tmp/newcomer-shots

``--open NB`` (repeatable) instead opens the chosen notebooks as stored — no Run All — and screenshots each of
their cells (``<shots>/<notebook>/cell_NN.png``), to read a chapter as a learner first sees it. ``--no-bootstrap``
uses the clone's ``.venv`` as it is (e.g. a symlink to an existing one) instead of running bootstrap.sh.

``--overlay`` also copies the working tree's uncommitted (not git-ignored) files over the clone, to try work
that is not committed yet. Everything the script starts (JupyterLab, its kernels and their ranks, Chromium) is
stopped in a ``finally`` block, by process id. A JSON summary (timings, errors, what rendered) is written beside
the screenshots. Exit code 0 when the live MFU appeared, no cell raised and every notebook link on the index
opens.
"""

from __future__ import annotations

import argparse
import json
import os
import posixpath
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import jlab  # scripts/jlab.py: the page steps shared with tests/test_browser.py

REPO = Path(__file__).resolve().parent.parent
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (read from /proc), children first."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def stop_tree(proc: subprocess.Popen) -> None:
    """Stop a process we started and every process below it (kernels run in their own sessions)."""
    if proc.poll() is not None:
        return
    below = descendants(proc.pid)
    proc.send_signal(signal.SIGTERM)        # JupyterLab shuts its kernels down on SIGTERM
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
    for pid in below:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def prepare_clone(src: Path, dest: Path, overlay: bool) -> float:
    t0 = time.perf_counter()
    if dest.exists():
        shutil.rmtree(dest)
    subprocess.run(["git", "clone", "-q", str(src), str(dest)], check=True)
    if overlay:   # the working tree's files that git does not ignore (committed or not)
        files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=src, check=True,
                               capture_output=True, text=True).stdout.split("\0")
        for f in filter(None, files):
            s = src / f
            if s.is_file():
                (dest / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(s, dest / f)
    return time.perf_counter() - t0


def wait_http(url: str, proc: subprocess.Popen, timeout: float) -> None:
    t_end = time.time() + timeout
    while time.time() < t_end:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with code {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer in {timeout:.0f} s")


def dismiss_news(page, shots: Path, summary: dict) -> None:
    """The 'Jupyter news' notification a first start shows: screenshot it once, then answer No."""
    toast = page.locator(".jp-Notification-Toast, .Toastify__toast").filter(has_text=re.compile("news", re.I))
    if toast.count():
        page.screenshot(path=str(shots / "00_news_popup.png"))
        summary["news_popup"] = toast.first.inner_text()
        no = toast.first.get_by_role("button", name=re.compile("^No$"))
        if no.count():
            no.first.click()


def cell_with(panel, pattern: str):
    cells = panel.locator(".jp-CodeCell").filter(has=panel.page.locator(".jp-OutputArea", has_text=re.compile(pattern)))
    return cells.first if cells.count() else None


def broken_links(page, base: str, index: str) -> list[str]:
    """Notebook links on the index page that the server cannot open (e.g. outside its root_dir).

    JupyterLab rewrites a relative link to ``{base}/files/<path>`` and clamps ``..`` at the server's root,
    so ``../labs/x.ipynb`` from a root of chapters/ becomes ``/files/labs/x.ipynb`` — which does not exist.
    """
    hrefs = page.eval_on_selector_all(".jp-NotebookPanel a", "els => els.map(e => e.getAttribute('href'))")
    folder = posixpath.dirname(index)
    bad = []
    for h in sorted(set(filter(None, hrefs))):
        url = urllib.parse.urlsplit(h)
        if not url.path.endswith(".ipynb"):
            continue
        if url.path.startswith("/files/"):
            target = urllib.parse.unquote(url.path[len("/files/"):])
        elif not url.scheme:
            target = posixpath.normpath(posixpath.join(folder, urllib.parse.unquote(url.path)))
        else:
            continue
        try:
            urllib.request.urlopen(f"{base}/api/contents/{urllib.parse.quote(target)}?content=0", timeout=10)
        except OSError as e:
            bad.append(f"{target}: {e}")
    return bad


def run_notebook(page, base: str, index: str, nb: str, shots: Path, summary: dict, timeout: float) -> None:
    """Open notebook ``nb`` (a repository path), Run All Cells as a learner would, and record the time, every error
    and stderr output, with a screenshot of each error and of the notebook's end."""
    rel = nb[len("chapters/"):] if index == "index.ipynb" and nb.startswith("chapters/") else nb
    out = shots / Path(nb).stem
    out.mkdir(parents=True, exist_ok=True)
    page.goto(f"{base}/lab/tree/{urllib.parse.quote(rel)}")
    page.wait_for_selector(f"{jlab.VISIBLE} .jp-Cell", timeout=60_000)
    jlab.wait_kernel_idle(page, 90)
    time.sleep(4)                                   # the kernel connects; the menu's commands enable
    took = jlab.run_all(page, timeout, clear_first=True)
    prompts = page.locator(f"{jlab.VISIBLE} .jp-CodeCell .jp-InputPrompt")
    ran = sum(1 for i in range(prompts.count()) if re.search(r"\[\d+\]", prompts.nth(i).inner_text() or ""))
    panel = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
    # an error output, whatever its mime attribute says in this JupyterLab: its text has the traceback header
    errors = panel.locator(".jp-OutputArea-output").filter(has_text=re.compile(r"Traceback \(most recent call last\)"))
    found = [errors.nth(i).inner_text()[-1500:] for i in range(errors.count())]
    for i in range(errors.count()):
        errors.nth(i).scroll_into_view_if_needed()
        errors.nth(i).screenshot(path=str(out / f"error_{i}.png"))
    last = panel.locator(".jp-CodeCell").last
    last.scroll_into_view_if_needed()
    last.screenshot(path=str(out / "last_cell.png"))
    summary.setdefault("ran", {})[nb] = {"run_all_s": round(took, 1), "errors": found, "cells_run": ran,
                                         "code_cells": prompts.count(),
                                         "last_output": last.locator(".jp-OutputArea").text_content()[-600:]}
    log(f"{nb}: Run All in {took:.1f} s, {ran} of {prompts.count()} code cells ran, {len(found)} error(s)")


def shoot_notebook(page, base: str, index: str, nb: str, shots: Path, summary: dict) -> None:
    """Open notebook ``nb`` (a repository path) as stored and screenshot every cell, top to bottom."""
    rel = nb[len("chapters/"):] if index == "index.ipynb" and nb.startswith("chapters/") else nb
    out = shots / Path(nb).stem
    out.mkdir(parents=True, exist_ok=True)
    page.goto(f"{base}/lab/tree/{urllib.parse.quote(rel)}")
    page.wait_for_selector(f"{jlab.VISIBLE} .jp-Cell", timeout=60_000)
    time.sleep(4)                                   # markdown, math and widget views settle
    dismiss_news(page, shots, summary)
    cells = page.locator(f"{jlab.VISIBLE} .jp-Cell")
    n = cells.count()
    for i in range(n):
        cells.nth(i).scroll_into_view_if_needed()
        cells.nth(i).screenshot(path=str(out / f"cell_{i:02d}.png"))
    panel = page.locator(jlab.VISIBLE)
    errors = panel.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.error']")
    summary.setdefault("opened", {})[nb] = {"cells": n, "errors": errors.count(), "shots": str(out)}
    log(f"{nb}: {n} cells shot into {out}")


def browse(port: int, shots: Path, chromium: str | None, run_timeout: float, summary: dict,
           opens: list[str] | None = None, runs: list[str] | None = None) -> None:
    from playwright.sync_api import sync_playwright

    base = f"http://127.0.0.1:{port}"
    with sync_playwright() as p:
        kw = {"headless": True, "args": CHROMIUM_ARGS}
        if chromium:
            kw["executable_path"] = chromium
        browser = p.chromium.launch(**kw)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            t0 = time.perf_counter()
            # `jupyter lab chapters/index.ipynb` serves from chapters/ (the file's folder), not the repo root
            try:
                urllib.request.urlopen(f"{base}/api/contents/index.ipynb?content=0", timeout=10)
                index = "index.ipynb"
            except OSError:
                index = "chapters/index.ipynb"
            summary["index_url"] = f"{base}/lab/tree/{index}"
            page.goto(summary["index_url"])
            page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=60_000)
            jlab.wait_kernel_idle(page, 60)
            summary["index_open_s"] = round(time.perf_counter() - t0, 1)
            # the labs the index links to are the released copies: no solution or hidden check reachable
            leaked = []
            for lab in ("lab01_baseline", "lab02_profiler", "lab05_ddp"):
                try:
                    with urllib.request.urlopen(f"{base}/api/contents/labs/{lab}/{lab}.ipynb", timeout=10) as r:
                        text = r.read().decode()
                except OSError as e:
                    leaked.append(f"{lab}: not served ({e})")
                    continue
                if "BEGIN SOLUTION" in text or "BEGIN HIDDEN" in text:
                    leaked.append(f"{lab}: solutions visible")
            summary["lab_copies"] = leaked or "released copies (no solutions)"
            time.sleep(1)
            dismiss_news(page, shots, summary)
            page.screenshot(path=str(shots / "01_index.png"))

            summary["index_broken_links"] = broken_links(page, base, index)
            if opens:
                for nb in opens:
                    shoot_notebook(page, base, index, nb, shots, summary)
                return
            if runs:
                for nb in runs:
                    run_notebook(page, base, index, nb, shots, summary, run_timeout)
                return
            link = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) a[href*='ch04_mfu_hfu.ipynb']").first
            summary["index_links_to_ch04"] = page.locator("a[href*='ch04_mfu_hfu.ipynb']").count()
            t0 = time.perf_counter()
            link.click()
            page.wait_for_selector(".lm-TabBar-tab:has-text('ch04_mfu_hfu.ipynb')", timeout=60_000)
            page.wait_for_selector(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell", timeout=60_000)
            jlab.wait_kernel_idle(page, 90)
            summary["ch04_open_s"] = round(time.perf_counter() - t0, 1)
            dismiss_news(page, shots, summary)
            page.screenshot(path=str(shots / "02_ch04_opened.png"))

            summary["ch04_run_all_s"] = round(jlab.run_all(page, run_timeout), 1)
            panel = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
            page.screenshot(path=str(shots / "03_ch04_after_run_all.png"))

            errors = panel.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.error']")
            summary["errors"] = [errors.nth(i).inner_text()[-2000:] for i in range(errors.count())]
            stderr = panel.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
            summary["stderr"] = [stderr.nth(i).inner_text()[-800:] for i in range(stderr.count())]
            for i in range(errors.count()):
                errors.nth(i).scroll_into_view_if_needed()
                errors.nth(i).screenshot(path=str(shots / f"09_error_{i}.png"))

            mfu_cell = cell_with(panel, r"= MFU [\d.]+%;.*\[peak: ")   # section 5's live-run cell
            if mfu_cell is not None:
                mfu_cell.scroll_into_view_if_needed()
                mfu_cell.screenshot(path=str(shots / "04_ch04_live_mfu.png"))
                summary["live_mfu_text"] = mfu_cell.locator(".jp-OutputArea").text_content()
            done = cell_with(panel, r"chapter 4 done")
            summary["last_cell"] = done.locator(".jp-OutputArea").text_content() if done is not None else None

            sliders = panel.locator(".widget-slider, .jupyter-widgets .widget-hslider")
            summary["widget_sliders_rendered"] = sliders.count()
            calc = cell_with(panel, r"MFU / HFU calculator")
            if calc is not None:
                calc.scroll_into_view_if_needed()
                calc.screenshot(path=str(shots / "05_ch04_calculator.png"))
                summary["calculator_text"] = calc.locator(".jp-OutputArea").text_content()[:1500]
        finally:
            browser.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, default=REPO, help="repository to clone (default: this one)")
    ap.add_argument("--clone", type=Path, default=Path(tempfile.gettempdir()) / "newcomer",
                    help="where the clean clone goes (deleted first)")
    ap.add_argument("--overlay", action="store_true", help="copy the source's uncommitted files over the clone")
    ap.add_argument("--reuse", action="store_true", help="keep an existing clone and its .venv (skip clone)")
    ap.add_argument("--shots", type=Path, default=Path(tempfile.gettempdir()) / "newcomer-shots")
    ap.add_argument("--chromium", default="/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    ap.add_argument("--lab-arg", action="append", default=[],
                    help="extra argument for `jupyter lab` (repeatable), e.g. --lab-arg=--ServerApp.root_dir=.")
    ap.add_argument("--no-widgets", action="store_true",
                    help="disable the ipywidgets front end, to see what a viewer without widgets gets")
    ap.add_argument("--open", action="append", default=[], metavar="NB",
                    help="open this notebook (repository path) as stored and screenshot every cell (repeatable); "
                         "skips chapter 4's Run All")
    ap.add_argument("--run", action="append", default=[], metavar="NB",
                    help="open this notebook (repository path) and Run All Cells as a learner would (repeatable); "
                         "skips chapter 4's Run All")
    ap.add_argument("--no-bootstrap", action="store_true", help="use the clone's .venv as it is")
    ap.add_argument("--venv", type=Path, default=None,
                    help="with --no-bootstrap: link the clone's .venv to this existing one (nothing is installed)")
    ap.add_argument("--run-timeout", type=float, default=900.0, help="seconds for Run All Cells in chapter 4")
    args = ap.parse_args(argv)

    args.shots.mkdir(parents=True, exist_ok=True)
    summary: dict = {}
    if not args.reuse:
        summary["clone_s"] = round(prepare_clone(args.source, args.clone, args.overlay), 1)
        log(f"clone ready in {summary['clone_s']} s: {args.clone}")
    if args.venv is not None:
        if not args.no_bootstrap:
            ap.error("--venv needs --no-bootstrap (bootstrap.sh would install into the linked venv)")
        link = args.clone / ".venv"
        if not link.exists():
            link.symlink_to(args.venv.resolve(), target_is_directory=True)
    if not args.no_bootstrap:
        t0 = time.perf_counter()
        boot = subprocess.run(["./scripts/bootstrap.sh", "lab"], cwd=args.clone, capture_output=True, text=True)
        summary["bootstrap_s"] = round(time.perf_counter() - t0, 1)
        summary["bootstrap_output"] = (boot.stdout + boot.stderr)[-3000:]
        log(f"bootstrap rc={boot.returncode} in {summary['bootstrap_s']} s")
        if boot.returncode != 0:
            print(summary["bootstrap_output"], file=sys.stderr)
            return 1

    # what `make course` does next: the learner's working copy (released labs, outputs saved there)
    rel = subprocess.run([str(args.clone / ".venv/bin/python"), "-m", "labkit", "release", "--course", "my-course"],
                         cwd=args.clone, capture_output=True, text=True)
    summary["course_copy"] = (rel.stdout + rel.stderr)[-2000:]
    if rel.returncode != 0:
        print(summary["course_copy"], file=sys.stderr)
        return 1
    port = jlab.free_port()
    state = Path(tempfile.mkdtemp(prefix="newcomer-jupyter-"))
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(state / "runtime"), JUPYTERLAB_SETTINGS_DIR=str(state / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(state / "workspaces"))
    if args.no_widgets:
        (state / "config" / "labconfig").mkdir(parents=True)
        (state / "config" / "labconfig" / "page_config.json").write_text(
            json.dumps({"disabledExtensions": {"@jupyter-widgets/jupyterlab-manager": True}}))
        env["JUPYTER_CONFIG_DIR"] = str(state / "config")
    if args.open or args.run:   # render every cell (no windowing), so each can be shot (and its errors found)
        tracker = state / "settings" / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
        tracker.parent.mkdir(parents=True)
        tracker.write_text(json.dumps({"windowingMode": "none"}))
    # root_dir = the course copy, as `make course` serves it (a bare `jupyter lab chapters/index.ipynb` would
    # serve chapters/ only, and the index's links to ../labs/ would break); a --lab-arg may override it
    cmd = [str(args.clone / ".venv/bin/jupyter"), "lab", "--ServerApp.root_dir=.", *args.lab_arg,
           "chapters/index.ipynb", "--no-browser",
           "--IdentityProvider.token=", "--ServerApp.password=", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
           "--ServerApp.port_retries=0"]
    if os.geteuid() == 0:    # containers run as root; JupyterLab refuses that without the flag
        cmd.append("--allow-root")
    server_log = open(args.shots / "jupyter.log", "w")
    server = subprocess.Popen(cmd, cwd=args.clone / "my-course", env=env, stdout=server_log, stderr=subprocess.STDOUT)
    ok = False
    try:
        t0 = time.perf_counter()
        wait_http(f"http://127.0.0.1:{port}/api/status", server, 120)
        summary["server_start_s"] = round(time.perf_counter() - t0, 1)
        log(f"JupyterLab on 127.0.0.1:{port} in {summary['server_start_s']} s")
        browse(port, args.shots, args.chromium, args.run_timeout, summary, args.open, args.run)
        if args.run and not args.open:
            ok = len(summary.get("ran", {})) == len(args.run) and not any(v["errors"] for v in summary["ran"].values())
        elif args.open:
            ok = len(summary.get("opened", {})) == len(args.open) and not any(
                v["errors"] for v in summary["opened"].values())
        else:
            ok = bool(summary.get("live_mfu_text")) and not summary.get("errors") and not summary.get("index_broken_links")
    except Exception as e:   # record what a newcomer would have been stuck on, then clean up
        summary["failure"] = f"{type(e).__name__}: {e}"
        log(summary["failure"])
    finally:
        stop_tree(server)
        server_log.close()
        shutil.rmtree(state, ignore_errors=True)
        (args.shots / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False))
        log(f"summary: {args.shots / 'summary.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
