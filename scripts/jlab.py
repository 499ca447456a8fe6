"""Driving JupyterLab in a real browser: the page steps shared by ``scripts/try_in_browser.py`` (screenshots
for a person) and ``tests/test_browser.py`` (assertions in the suite). Needs ``playwright``'s page objects."""
from __future__ import annotations

import re
import socket
import time

VISIBLE = ".jp-NotebookPanel:not(.lm-mod-hidden)"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def menu(page, name: str, command: str) -> None:
    """Click menu ``name`` (e.g. "Run") and then its item ``command`` (e.g. "runmenu:run-all")."""
    page.locator(".lm-MenuBar-item", has_text=re.compile(f"^{name}$")).click()
    page.locator(f'.lm-Menu-item[data-command="{command}"]').click()


def wait_kernel_idle(page, timeout_s: float) -> None:
    """Wait until the visible notebook's kernel says it is idle."""
    page.wait_for_function(
        f"""() => {{ const s = document.querySelector('{VISIBLE} .jp-Notebook-ExecutionIndicator');
                   return s && s.getAttribute('data-status') === 'idle'; }}""", timeout=timeout_s * 1000)


def run_all(page, timeout_s: float, *, clear_first: bool = False) -> float:
    """Run All Cells of the visible notebook and wait until no prompt shows [*]; returns the seconds taken.

    ``clear_first`` clears the stored outputs before, so every output read afterwards is this run's."""
    if clear_first:
        menu(page, "Edit", "editmenu:clear-all")
        page.wait_for_function(f"() => !document.querySelector('{VISIBLE} .jp-OutputArea-output')", timeout=30_000)
    t0 = time.perf_counter()
    menu(page, "Run", "runmenu:run-all")
    time.sleep(2)
    page.wait_for_function(
        f"""() => {{ const nb = document.querySelector('{VISIBLE}');
                   if (!nb) return false;
                   const busy = [...nb.querySelectorAll('.jp-InputPrompt')].some(p => p.textContent.includes('*'));
                   const ind = nb.querySelector('.jp-Notebook-ExecutionIndicator');
                   return !busy && (!ind || ind.getAttribute('data-status') === 'idle'); }}""",
        timeout=timeout_s * 1000, polling=2000)
    return time.perf_counter() - t0
