"""Execute one submission under papermill, surviving whatever it does (run as a subprocess).

``python -P -m labkit.teaching.grading.executor SPEC.json`` — started by :mod:`labkit.teaching.grading.batch` in the
submission's own folder, in a new session, with the :class:`~labkit.teaching.grading.sandbox.Limits` rlimits.
It registers a papermill engine (``labkit-grade``) whose client

- keeps going after a failing cell (like ``--allow-errors``), so later questions are still graded;
- interrupts a cell past its time limit (``cell_s``) and stops if the kernel does not come back;
- keeps at most ``output_mb`` of cell output and counts what it dropped (a flood cannot exhaust memory);
- notices a dead kernel (``os._exit``, a crash, a memory kill) and stops cleanly.

A watchdog kills the whole process tree (kernel, ranks) at the notebook deadline; because this process
is a child subreaper, ranks orphaned by a dead launcher are killed too. When the grader dies (even by
``kill -9``) this process gets SIGTERM (``PR_SET_PDEATHSIG``), kills its tree and exits
(:func:`die_with_grader`), so no executor outlives its grader. The per-cell report (matched by
``metadata.labkit.id``) goes to the status JSON; nothing the kernel prints is interpreted.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from labkit.teaching.grading import sandbox

ENGINE = "labkit-grade"


def _client_class():
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    from papermill.clientwrap import PapermillNotebookClient

    class GradingClient(PapermillNotebookClient):
        def __init__(self, nb_man, *, output_bytes: int, report: dict, **kw):
            super().__init__(nb_man, **kw)
            self.output_bytes, self.report = output_bytes, report
            self._kept = 0
            self._noted: set[int] = set()
            self._timed_out = False

        def execute(self, **kwargs):
            self.reset_execution_trackers()
            with self.setup_kernel(**kwargs):
                self.report["kernel_started"] = True
                self.papermill_execute_cells()
            return self.nb

        async def _async_handle_timeout(self, timeout, cell=None):
            self._timed_out = True
            return await super()._async_handle_timeout(timeout, cell)

        def papermill_execute_cells(self):
            cells = self.report["cells"]
            for index, cell in enumerate(self.nb.cells):
                meta = cell.get("metadata", {}).get("labkit")
                entry = {"index": index, "id": meta.get("id") if isinstance(meta, dict) else None,
                         "type": cell.cell_type, "executed": False, "error": None, "timed_out": False}
                cells.append(entry)
                if cell.cell_type != "code":
                    continue
                self._timed_out = False
                t0 = time.perf_counter()
                stop = None
                try:
                    self.nb_man.cell_start(cell, index)
                    self.execute_cell(cell, index)
                except CellTimeoutError:
                    self._timed_out, stop = True, "kernel did not return after the cell time limit"
                except DeadKernelError:
                    stop = "kernel died"
                    self.report["kernel_died"] = True
                except Exception as e:  # noqa: BLE001 - an unexpected client error ends this notebook only
                    stop = f"executor error: {type(e).__name__}: {e}"
                finally:
                    try:
                        self.nb_man.cell_complete(self.nb.cells[index], cell_index=index)
                    except Exception:  # noqa: BLE001 - saving progress is best effort
                        pass
                entry["executed"] = cell.get("execution_count") is not None or bool(cell.get("outputs"))
                entry["seconds"] = round(time.perf_counter() - t0, 3)
                entry["timed_out"] = self._timed_out
                for out in cell.get("outputs", []):
                    if out.get("output_type") == "error":
                        entry["error"] = {"ename": str(out.get("ename"))[:200], "evalue": str(out.get("evalue"))[:500]}
                        break
                if stop:
                    entry["stopped"] = stop
                    self.report["stopped"] = f"cell {index}: {stop}"
                    return

        def _note(self, outs, cell_index):
            if cell_index not in self._noted:
                self._noted.add(cell_index)
                from nbformat.v4 import new_output

                outs.append(new_output("stream", name="stderr",
                                       text="[labkit grade: output limit reached; further output dropped]\n"))

        def output(self, outs, msg, display_id, cell_index):
            if self._kept >= self.output_bytes:
                self.report["output_dropped_bytes"] += len(json.dumps(msg.get("content", {}), default=str))
                self._note(outs, cell_index)
                return None
            out = super().output(outs, msg, display_id, cell_index)
            if out is None:
                return out
            size = len(json.dumps(out, default=str))
            room = self.output_bytes - self._kept
            if size <= room:
                self._kept += size
                return out
            # one message can hold megabytes (the kernel batches stdout): keep what fits, drop the rest
            if out.get("output_type") == "stream":
                out["text"] = out["text"][:room]
            elif out in outs:
                outs.remove(out)
            self.report["output_dropped_bytes"] += size - room
            self._kept = self.output_bytes
            self._note(outs, cell_index)
            return out

    return GradingClient


def _register_engine():
    from papermill.engines import Engine, papermill_engines

    client_cls = _client_class()

    class GradingEngine(Engine):
        @classmethod
        def execute_managed_notebook(cls, nb_man, kernel_name, log_output=False, stdout_file=None,
                                     stderr_file=None, start_timeout=60, execution_timeout=None, **kw):
            import logging

            return client_cls(
                nb_man, output_bytes=kw["output_bytes"], report=kw["report"], timeout=execution_timeout,
                startup_timeout=start_timeout, kernel_name=kernel_name, log=logging.getLogger("labkit.grade"),
                allow_errors=True, interrupt_on_timeout=True,
                error_on_timeout={"ename": "CellTimeoutError", "evalue": f"cell exceeded {execution_timeout} s",
                                  "traceback": [f"CellTimeoutError: cell exceeded {execution_timeout} s"]},
            ).execute()

    papermill_engines.register(ENGINE, GradingEngine)


def die_with_grader(grader_pid: int | None, poll_s: float = 0.5) -> None:
    """Take the kernel and ranks down with this process when the grader dies: on SIGTERM (the grader
    arms ``PR_SET_PDEATHSIG`` in this process, :func:`labkit.teaching.grading.sandbox.die_with_parent`) and, as a
    fallback where that signal is missing, when the parent pid stops being ``grader_pid``."""
    me = os.getpid()
    parent = grader_pid or os.getppid()

    def stop(*_):
        sandbox.kill_tree(me, include_self=False)
        os._exit(3)

    signal.signal(signal.SIGTERM, stop)
    if os.getppid() != parent:   # the grader died before we got here
        stop()

    def orphaned():
        while os.getppid() == parent:
            time.sleep(poll_s)
        stop()

    threading.Thread(target=orphaned, daemon=True).start()


CAUGHT = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGTSTP")


def _signals_are_tampering(report: dict, status: str) -> None:
    """In a cage (:mod:`labkit.teaching.grading.isolation`) this process is the PID namespace's init: nothing outside
    signals it (the grader ends the cage with SIGKILL, which init cannot catch), and from inside only the
    signals it handles reach it (``pid_namespaces(7)``). So a caught signal came from the submission, aimed at
    the grader: recorded (``report["signalled"]``), the run ended, the report written."""
    from labkit.record import atomic_write_text

    def caught(signum, _frame):
        report["signalled"] = signal.Signals(signum).name
        report["stopped"] = f"the submission sent {signal.Signals(signum).name} to the grader's executor"
        sandbox.kill_tree(os.getpid(), include_self=False)
        atomic_write_text(status, json.dumps(report, indent=1))
        os._exit(4)

    for name in CAUGHT:
        signal.signal(getattr(signal, name), caught)


def run(spec: dict) -> dict:
    """Execute ``spec["input"]`` into ``spec["output"]``; return the report (also written to ``spec["status"]``)."""
    if not spec.get("caged"):
        die_with_grader(spec.get("grader_pid"))   # first: before the seconds papermill takes to import
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    report = {"cells": [], "kernel_started": False, "kernel_died": False, "deadline_hit": False,
              "stopped": None, "output_dropped_bytes": 0, "error": None, "subreaper": sandbox.become_subreaper()}
    me = os.getpid()
    if spec.get("caged"):
        _signals_are_tampering(report, spec["status"])

    def deadline():
        report["deadline_hit"] = True
        report["stopped"] = report["stopped"] or f"notebook time limit ({spec['notebook_s']} s) reached"
        sandbox.kill_tree(me, include_self=False)

    timer = threading.Timer(float(spec["notebook_s"]), deadline)
    timer.daemon = True
    t0 = time.perf_counter()
    timer.start()
    try:
        _register_engine()
        pm.execute_notebook(
            spec["input"], spec["output"], parameters=spec.get("parameters") or None, engine_name=ENGINE,
            kernel_name=spec.get("kernel_name", "python3"), language="python", cwd=spec["cwd"],
            progress_bar=False, log_output=False, execution_timeout=spec["cell_s"],
            start_timeout=spec.get("start_timeout", 60), request_save_on_cell_execute=True,
            output_bytes=int(spec["output_bytes"]), report=report,
        )
    except PapermillExecutionError:
        pass  # cell errors are in the report; papermill already saved the notebook
    except Exception as e:  # noqa: BLE001 - recorded, the batch goes on
        report["error"] = f"{type(e).__name__}: {str(e)[:1000]}"
    finally:
        timer.cancel()
        report["orphans_killed"] = sandbox.kill_tree(me, include_self=False)
        report["wall_s"] = round(time.perf_counter() - t0, 3)
    from labkit.record import atomic_write_text

    atomic_write_text(spec["status"], json.dumps(report, indent=1))
    return report


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m labkit.teaching.grading.executor SPEC.json", file=sys.stderr)
        return 2
    from labkit.teaching.notebooks import skip_iri_grammar

    skip_iri_grammar()          # this process imports papermill: one per submission
    spec = json.loads(Path(argv[0]).read_text())
    run(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
