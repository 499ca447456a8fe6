"""The course's text keeps three promises of issue #14, checked on the stored notebooks' sources:

(a) every ⚠ correction listed in the issue stands in the chapter that owns it, as a box with the source's
    claim, what is right and a citation (``REQUIRED_WARNINGS``);
(b) no SYNTHETIC artefact is called "recorded" or "measured" (:func:`synthetic_wording_violations`);
(c) no markdown link — in a notebook's markdown or in a stored Markdown output such as the glossary's table
    — points to a notebook that does not exist (:func:`dead_notebook_links`).

The seed cases' ⚠ records (BERT-large, 13B) are held by ``tests/test_cases.py``; the glossary CSV's chapter
ids by ``tests/test_glossary.py``.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_cases import _cells  # (cell id, cell type, source) of a stored notebook's cells

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for d in ("chapters", "labs") for p in (ROOT / d).rglob("*.ipynb")
                   if ".ipynb_checkpoints" not in p.parts)

# ------------------------------------------------------------------------------------ (a) required ⚠
P1, P2, P3 = "chapters/part1_cognition/", "chapters/part2_diagnosis/", "chapters/part3_tuning/"
#: (chapter, a phrase of the box, a URL the box cites)
REQUIRED_WARNINGS = [
    (P1 + "ch02_five_bottlenecks.ipynb", "means two things: job scheduling and host scheduling",
     "https://slurm.schedmd.com/overview.html"),
    (P1 + "ch03_counting_flops.ipynb", "counts the full T×T matrix, also for a causal model",
     "https://github.com/pytorch/pytorch/blob/main/torch/utils/flop_counter.py"),
    (P2 + "ch12_telemetry_topology.ipynb", "are Jetson tools, not data-centre GPU tools",
     "https://docs.nvidia.com/deploy/nvidia-smi/index.html"),
    (P2 + "ch13_memory.ipynb", "saves 75 %\" holds for 4 ranks; and the parameters are all-gathered",
     "https://arxiv.org/abs/1910.02054"),
    (P2 + "ch13_memory.ipynb", "FSDP sends 1.5× DDP's bytes per step, not 2×",
     "https://arxiv.org/abs/2304.11277"),
    (P2 + "ch13_memory.ipynb", "`bucket_cap_mb` is DDP's knob, not FSDP's",
     "https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html"),
    (P2 + "ch14_systematic_diagnosis.ipynb", "troubleshooting tree sends you to `nvprof`",
     "https://docs.nvidia.com/cuda/profiler-users-guide/index.html"),
    (P2 + "ch14_systematic_diagnosis.ipynb", "KPIs are not `labkit.diagnose`'s thresholds",
     "https://docs.nvidia.com/deploy/nvidia-smi/index.html"),
    (P3 + "ch15_microbatch_accumulation.ipynb", "\"Case A is strictly better than case B\" overstates it",
     "https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html"),
    (P3 + "ch23_communication_optimization.ipynb", "`NCCL_SOCKET_IFNAME=efa` stops bootstrap, `NCCL_ALGO=Tree` stops FSDP",
     "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"),
    (P3 + "ch23_communication_optimization.ipynb", "aws-ofi-nccl says of `RDMAV_FORK_SAFE`: do not use",
     "https://github.com/aws/aws-ofi-nccl/blob/master/doc/efa-env-var.md"),
    (P3 + "ch18_mixed_precision.ipynb", "`SafeLayer` returns `.half()`: under bf16 autocast it forces fp16",
     "https://pytorch.org/docs/stable/amp.html"),
    (P3 + "ch19_ddp_buckets.ipynb", "`bucket_cap_mb` is DDP's parameter, not FSDP's",
     "https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html"),
    (P3 + "ch19_ddp_buckets.ipynb", "\"25–100 MB is usually best\" is a hypothesis, not a rule",
     "https://arxiv.org/abs/2006.15704"),
    (P3 + "ch20_fsdp_zero.ipynb", "FULL_SHARD sends 1.5× DDP's bytes at the same dtype, not 2× — and under a bf16 policy",
     "https://arxiv.org/abs/2304.11277"),
    (P3 + "ch20_fsdp_zero.ipynb", "`limit_all_gathers` is a rate limiter, not the switch that keeps weights",
     "https://pytorch.org/docs/stable/fsdp.html"),
    (P3 + "ch25_adaptive_accumulation.ipynb", "`lr × accum` is Goyal et al.'s linear rule for SGD, not a default for AdamW",
     "https://arxiv.org/abs/2205.10287"),
    (P3 + "ch25_adaptive_accumulation.ipynb", "`max_norm = 0.1·√accum` assumes summed, not averaged, gradients",
     "https://pytorch.org/docs/stable/notes/amp_examples.html"),
    (P3 + "ch25_adaptive_accumulation.ipynb", "ratio per step makes the rule oscillate",
     "https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html"),
    (P3 + "ch22_data_pipeline.ipynb", "\"`num_workers` = CPU cores ÷ GPUs per node\" is a ceiling, not the setting",
     "https://pytorch.org/docs/stable/data.html#multi-process-data-loading"),
    (P3 + "ch22_data_pipeline.ipynb", "`pin_memory=True` speeds up nothing without CUDA",
     "https://pytorch.org/docs/stable/data.html#memory-pinning"),
    (P3 + "ch24_parallel_layout.ipynb", "warning against tuning only the batch size, confirmed: the layout changes memory and traffic",
     "https://arxiv.org/abs/2104.04473"),
    (P3 + "ch24_parallel_layout.ipynb", "warning against blaming an OOM on the model's size, confirmed: the weights are often the smallest part",
     "https://arxiv.org/abs/1910.02054"),
    (P3 + "ch21_checkpointing_offload.ipynb", "Selective recomputation saves nothing when the attention kernel is fused",
     "https://arxiv.org/abs/2205.05198"),
    (P3 + "ch21_checkpointing_offload.ipynb", "Offloading the optimizer does not move the optimizer state every step",
     "https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html"),
    ("chapters/part4_case_review/ch27_multinode_elastic.ipynb", "is cluster scheduling, not a slow step",
     "https://slurm.schedmd.com/overview.html"),
    ("chapters/part4_case_review/ch30_case_bert_checklist.ipynb", "2.7× rests on the communication fix the source credits",
     "https://arxiv.org/abs/2006.15704"),
    ("chapters/part4_case_review/ch30_case_bert_checklist.ipynb",
     "warnings against tuning only the batch and blaming an OOM on the model's size, confirmed",
     "https://arxiv.org/abs/2205.05198"),
    ("chapters/part4_case_review/ch30_case_bert_checklist.ipynb",
     "GPU-Util, \"communication < 40 %\" and \"pipeline efficiency > 70 %\" pass or fail depending on what",
     "https://docs.nvidia.com/deploy/nvidia-smi/index.html"),
    ("chapters/part4_case_review/ch30_case_bert_checklist.ipynb",
     "\"PCIe ≤ 70 %\" cannot judge the source's own job",
     "https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceQueries.html"),
]


def missing_warnings(sources: dict[str, list[str]], required=REQUIRED_WARNINGS) -> list[str]:
    """Required boxes not found: ``sources`` maps a chapter path to its markdown cells' sources. A box is one
    cell that opens with a ⚠ quote (``> **⚠``), contains the phrase and the URL, and says what is right."""
    bad = []
    for chapter, phrase, url in required:
        boxes = [s for s in sources.get(chapter, []) if "> **⚠" in s and phrase in s]
        if not boxes:
            bad.append(f"{chapter}: no ⚠ box with {phrase!r}")
        elif not any(url in s and "*What is right:*" in s and "*Source" in s for s in boxes):
            bad.append(f"{chapter}: the ⚠ box {phrase!r} lacks its citation {url} or its 'What is right' part")
    return bad


def _markdown_sources(path: Path) -> list[str]:
    return [src for _, kind, src in _cells(path) if kind == "markdown"]


def test_missing_warnings_finds_an_absent_box_and_an_uncited_one():
    ok = "> **⚠ Title with the phrase**\n>\n> *What is right:* this.\n>\n> *Sources:* https://example.org/a"
    req = [("ch.ipynb", "the phrase", "https://example.org/a")]
    assert missing_warnings({"ch.ipynb": ["intro", ok]}, req) == []
    assert missing_warnings({"ch.ipynb": ["the phrase, but no box"]}, req) == ["ch.ipynb: no ⚠ box with 'the phrase'"]
    [uncited] = missing_warnings({"ch.ipynb": [ok.replace("https://example.org/a", "a book")]}, req)
    assert "lacks its citation https://example.org/a" in uncited


def test_every_listed_warning_stands_in_its_chapter_with_its_source():
    sources = {chapter: _markdown_sources(ROOT / chapter) for chapter, _, _ in REQUIRED_WARNINGS}
    assert missing_warnings(sources) == []


# ---------------------------------------------------------------- (b) SYNTHETIC is never "recorded"/"measured"
def synthetic_artefact_names() -> set[str]:
    """File names of the shipped SYNTHETIC artefacts: every file of a datasets/ folder whose row in
    datasets/README.md starts with SYNTHETIC, and every file or folder named SYNTHETIC/synthetic elsewhere."""
    readme = (ROOT / "datasets" / "README.md").read_text()
    folders = re.findall(r"^\| `([\w-]+)/` \| SYNTHETIC", readme, flags=re.M)
    names = {p.name for f in folders for p in (ROOT / "datasets" / f).iterdir() if p.name != "README.md"}
    names |= {p.name for p in (ROOT / "datasets").rglob("*") if "synthetic" in p.name.lower()}
    return names


SYNTHETIC_WORD = re.compile(r"synthetic|synthesi[sz]e", re.I)
CLAIM = re.compile(r"\b(recorded|recordings?|measured)\b", re.I)
# what may stand just before the word: a negation or "live" ("not recorded", "no GPU run recorded",
# "live ranks measured"), at most three words back in the same clause
EXEMPT_BEFORE = re.compile(r"\b(not|never|no|nor|nothing|without|instead of|rather than|live)\b[^.;:\n]{0,30}$", re.I)


def sections(cells) -> list[list[tuple[str, str]]]:
    """``cells`` ((where, markdown or code, source)) grouped into sections: a markdown cell with a heading line
    starts a new one."""
    out: list[list[tuple[str, str]]] = [[]]
    for where, kind, src in cells:
        if kind == "markdown" and re.search(r"^#{1,6} ", src, flags=re.M) and out[-1]:
            out.append([])
        out[-1].append((where, src))
    return out


def synthetic_wording_violations(cells, artefacts: set[str] = frozenset()) -> list[str]:
    """Places where "recorded"/"recording"/"measured" stands in a section that mentions a SYNTHETIC artefact
    (the word SYNTHETIC or synthetic, or a shipped SYNTHETIC file's name) — unless a negation or "live" stands
    just before it, or it is a bare quoted column key (``["measured"]``)."""
    bad = []
    for sec in sections(cells):
        text = "\n".join(src for _, src in sec)
        if not (SYNTHETIC_WORD.search(text) or any(a in text for a in artefacts)):
            continue
        for where, src in sec:
            for m in CLAIM.finditer(src):
                before = src[max(0, m.start() - 40):m.start()]
                quoted_key = src[m.start() - 1:m.start()] in ("'", '"') and src[m.end():m.end() + 1] in ("'", '"')
                if EXEMPT_BEFORE.search(before) or quoted_key:
                    continue
                line = src[:m.start()].count("\n") + 1
                bad.append(f"{where} line {line}: {src[max(0, m.start() - 50):m.end() + 20]!r}")
    return bad


@pytest.mark.parametrize("cells, flagged", [
    ([("md", "markdown", "## 4. The fix, measured on the timeline\nthe second SYNTHETIC report")], True),
    ([("md", "markdown", "## 2. Reading\nreads outputs in `datasets/comm/` — **SYNTHETIC**"),
      ("md2", "markdown", "The busbw of the two recorded runs is the seed case's picture")], True),  # same section
    ([("c", "code", "else:   # recorded: one node\n    read('x.SYNTHETIC.txt')")], True),
    ([("c", "code", "tl = read_sqlite(dataset('nsys', 'step_async.sqlite'))\n# the fix, measured")], True),  # by name
    ([("md", "markdown", "## 3. SYNTHETIC GPU runs\nThere is no GPU here: nothing was recorded.")], False),
    ([("md", "markdown", "## 3. SYNTHETIC runs, not measured on a GPU")], False),
    ([("c", "code", "# live ranks measured every size; SYNTHETIC tables parsed")], False),
    ([("c", "code", 'assert seed_table["measured"].tolist() == [1.8]  # synthetic spec below')], False),
    ([("md", "markdown", "## 1. Live\nmeasured on this machine"), ("md", "markdown", "## 2. Other\nSYNTHETIC")], False),
])
def test_the_synthetic_wording_rule_on_small_examples(cells, flagged):
    assert bool(synthetic_wording_violations(cells, {"step_async.sqlite"})) is flagged


def test_the_rule_catches_the_wording_issue_14_found():
    old = [("ch14#362db03d", "markdown", "### Recorded GPU runs\n\nThere is no GPU here to record a trace from. "
            "`labkit.trace.synthetic` writes **SYNTHETIC** 8-GPU Kineto traces"),
           ("ch10#c0227b3b", "markdown", "## 4. The fix, measured on the timeline\n\nThe second shipped report:"),
           ("ch10#c1bd59d1", "code", "tl_async = nsys.read_sqlite(labkit.paths.dataset('nsys', 'step_async.sqlite'))")]
    found = synthetic_wording_violations(old, synthetic_artefact_names())
    assert [f.split(" line")[0] for f in found] == ["ch14#362db03d", "ch10#c0227b3b"], found


def test_no_synthetic_artefact_is_called_recorded_or_measured():
    names = synthetic_artefact_names()
    assert {"step_async.sqlite", "launch_bound_query_gpu.csv", "nccl_tests_all_reduce_2node_25gbe.SYNTHETIC.txt"} <= names
    bad = []
    for p in NOTEBOOKS:
        cells = [(f"{p.relative_to(ROOT)}#{cid}", kind, src) for cid, kind, src in _cells(p)]
        bad += synthetic_wording_violations(cells, names)
    assert bad == []


# ------------------------------------------------------------------- (c) links to notebooks that exist
LINK = re.compile(r"\]\(([^)\s]+?\.ipynb)(?:#[^)\s]*)?\)")


def dead_notebook_links(texts, base: Path) -> list[str]:
    """``.ipynb`` targets of Markdown links in ``texts`` ((where, text)) that do not exist relative to ``base``."""
    return [f"{where}: {t}" for where, text in texts for t in LINK.findall(text)
            if not t.startswith(("http://", "https://")) and not (base / t).is_file()]


def _markdown_texts(path: Path):
    """Markdown cell sources and stored Markdown outputs (the glossary renders its links as output)."""
    for c in json.loads(path.read_text())["cells"]:
        if c["cell_type"] == "markdown":
            yield f"{path.relative_to(ROOT)}#{c.get('id')}", "".join(c["source"])
        for o in c.get("outputs", []):
            md = o.get("data", {}).get("text/markdown")
            if md:
                yield f"{path.relative_to(ROOT)}#{c.get('id')} output", "".join(md)


def test_dead_notebook_links_on_small_examples(tmp_path):
    (tmp_path / "part1").mkdir()
    (tmp_path / "part1" / "ch01.ipynb").write_text("{}")
    texts = [("g", "| [ch01 Why](part1/ch01.ipynb) | [ch15 Batch](part3/ch15.ipynb) | ch16 Attention (planned) |"),
             ("i", "[anchor](part1/ch01.ipynb#section) [web](https://example.org/x.ipynb)")]
    assert dead_notebook_links(texts, tmp_path) == ["g: part3/ch15.ipynb"]


def test_no_markdown_link_points_to_a_missing_notebook():
    assert NOTEBOOKS
    bad = []
    for p in NOTEBOOKS:
        bad += dead_notebook_links(_markdown_texts(p), p.parent)
    glossary = (ROOT / "datasets" / "glossary.csv").read_text()
    bad += dead_notebook_links([("datasets/glossary.csv", glossary)], ROOT / "chapters")
    assert bad == []
