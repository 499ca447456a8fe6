"""Text a learner reads in a ~120-character notebook output area (issue #27): the diagnose report and run
summaries are wrapped at word boundaries within 100 characters (a longer line breaks mid-word there: "dat a
wait", "2026-1 2-01"), and the report marks one finding "<== primary", not every finding of the family."""
from __future__ import annotations

from labkit.diagnose.verdict import Diagnosis, Finding
from labkit.record import RunRecord, Stat

SOURCE = ("calibrated:matmul 512x512@512x512 fp32 on cpu (AMD EPYC, 1 threads), best of 3 rounds, 2026-12-01")


def _diagnosis() -> Diagnosis:
    straggler = Finding("scheduling", "high", 0.26, "ranks wait for rank 1 at the collectives (a straggler)",
                        {"peer_wait_share": 0.258, "peak_source": SOURCE}, {"peer_wait": 0.1},
                        ["balance the work of rank 1 (it arrives last; its compute before each collective is "
                         "longer) — check its device clocks/thermals, host load and its share of the data: up "
                         "to 26% of the step comes back"])
    host = Finding("scheduling", "high", 0.33, "the compute thread sits in no op (Python, sleeps, waits)",
                   {"idle_outside_ops_share": 0.331}, {"host_gap": 0.25},
                   ["profile the Python between ops (py-spy / torch.profiler with_stack) and remove host work "
                    "from the step loop; torch.compile cuts dispatch overhead"],
                   note="rank 1 arrives last at most collectives: 26% of the step is ranks waiting for a late "
                        "peer inside the collectives; see the scheduling finding; communication fixes win at most 4%")
    return Diagnosis([straggler, host], "scheduling-bound: the compute thread sits in no op " * 3, "scheduling",
                     {"mfu": 0.082, "data_wait_share": 0.006, "peak_source": SOURCE, "tokens_per_s": 2508.977})


def _words(text: str) -> list[str]:
    return text.split()


def test_the_diagnose_report_wraps_at_words_within_100_characters():
    d = _diagnosis()
    text = d.report()
    assert max(len(ln) for ln in text.splitlines()) <= 100, max(text.splitlines(), key=len)
    assert "2026-12-01" in text and "data_wait_share" in text        # no token was split
    one_line = "\n".join(d.report(width=10_000).splitlines())
    assert _words(text) == _words(one_line)                            # wrapping moved words, changed none


def test_only_one_finding_is_marked_primary():
    text = _diagnosis().report()
    assert text.count("<== primary") == 1
    import re

    blocks = re.split(r"\n(?=\d+\. \[)", text)
    marked = next(b for b in blocks if "<== primary" in b)
    assert "no op" in marked.split("evidence")[0]                     # the finding with the larger share


def test_a_run_summary_wraps_between_its_parts():
    rec = RunRecord(label="mystery", step_time=Stat.of([0.0995, 0.1005, 0.110, 0.0956]), tokens_per_step=256,
                    tokens_per_s=2509.0, n_devices=2, mfu=0.082, data_wait_share=0.006, comm_wait_share=0.3,
                    peak_memory_bytes=419_000_000, extra={"peak_memory_kind": "rss"})
    text = rec.summary()
    assert len(rec.summary(width=0)) > 120 and "\n" not in rec.summary(width=0)
    assert max(len(ln) for ln in text.splitlines()) <= 100 and "data wait 0.6%" in text
    assert text.replace("\n  ", " | ") == rec.summary(width=0)
