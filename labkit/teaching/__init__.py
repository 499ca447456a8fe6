"""The course's teaching objects: seed cases, mystery runs and tickets, quizzes, widgets, figures, notebooks
and grading.

- ``cases`` — the course's seed cases, told once from their cited sources (chapters 5, 14, 30);
- ``faults`` — mystery runs: a fault hidden by a seed (lab 2);
- ``capstone`` — the capstone's mystery workloads (lab 12);
- ``tickets`` — a lab's hidden fault drawn from a learner's ticket (labs 8 and 12);
- ``quiz`` — check-yourself questions and predictions with specific feedback;
- ``widgets`` — interactive calculators for the chapters, with a static fallback;
- ``viz`` — the course's figures: shared matplotlib helpers;
- ``notebooks`` — run the course notebooks as the suite does (``make refresh``);
- ``grading`` — graded labs: the lab format, evidence, release and batch grading.

``from labkit.teaching import <name>`` works for every name in ``__all__``; inside labkit, import the file
(``labkit.teaching.<file>``).
"""
from __future__ import annotations

import importlib

# The face hands each name out from the file that defines it, imported on first use
# (so importing one file of the package never imports the others, nor torch).
_FILES = ('cases', 'faults', 'capstone', 'tickets', 'quiz', 'widgets', 'viz', 'notebooks', 'grading')
_NAMES = {
    'FIXED': 'capstone',
    'GLOBAL_BATCH': 'capstone',
    'HIDDEN': 'capstone',
    'MYSTERIES': 'capstone',
    'Mystery': 'capstone',
    'Workload': 'capstone',
    'check_options': 'capstone',
    'global_batch': 'capstone',
    'BertLargeCase': 'cases',
    'CaseWarning': 'cases',
    'LINKS': 'cases',
    'LLAMA_13B_SHAPE': 'cases',
    'REALISTIC_LINK_SHARE': 'cases',
    'ThirteenBCase': 'cases',
    'bert_large': 'cases',
    'thirteen_b': 'cases',
    'warnings_markdown': 'cases',
    'FAULTS': 'faults',
    'Fault': 'faults',
    'LOADER_OPTIONS': 'faults',
    'LoaderJob': 'faults',
    'MysteryRun': 'faults',
    'mystery_run': 'faults',
    'public_record': 'faults',
    'CheckFailed': 'grading',
    'Evidence': 'grading',
    'EvidenceBook': 'grading',
    'GradeConfig': 'grading',
    'GradeResult': 'grading',
    'Lab': 'grading',
    'Limits': 'grading',
    'close': 'grading',
    'expect': 'grading',
    'grade': 'grading',
    'learner_notebook': 'grading',
    'load_lab': 'grading',
    'note': 'grading',
    'release': 'grading',
    'RefreshRefused': 'notebooks',
    'has_checked_outputs': 'notebooks',
    'main': 'notebooks',
    'nbval_command': 'notebooks',
    'output_problems': 'notebooks',
    'prepare_nbval': 'notebooks',
    'refresh': 'notebooks',
    'run': 'notebooks',
    'Feedback': 'quiz',
    'Prediction': 'quiz',
    'Question': 'quiz',
    'check_all': 'quiz',
    'evaluate': 'quiz',
    'KEYED_LABS': 'tickets',
    'issue': 'tickets',
    'keyed_lab': 'tickets',
    'parse': 'tickets',
    'read_key': 'tickets',
    'write_tickets': 'tickets',
    'bars': 'viz',
    'ddp_timeline': 'viz',
    'legend_outside': 'viz',
    'memory_timeline': 'viz',
    'new_axes': 'viz',
    'ring_allreduce': 'viz',
    'roofline': 'viz',
    'scaling': 'viz',
    'si': 'viz',
    'stacked_parts': 'viz',
    'Calculator': 'widgets',
    'Param': 'widgets',
    'cost_calculator': 'widgets',
    'mfu_calculator': 'widgets',
    'scaling_calculator': 'widgets',
    'widgets_available': 'widgets',
}
__all__ = [
    'BertLargeCase',
    'Calculator',
    'CaseWarning',
    'CheckFailed',
    'Evidence',
    'EvidenceBook',
    'FAULTS',
    'FIXED',
    'Fault',
    'Feedback',
    'GLOBAL_BATCH',
    'GradeConfig',
    'GradeResult',
    'HIDDEN',
    'KEYED_LABS',
    'LINKS',
    'LLAMA_13B_SHAPE',
    'LOADER_OPTIONS',
    'Lab',
    'Limits',
    'LoaderJob',
    'MYSTERIES',
    'Mystery',
    'MysteryRun',
    'Param',
    'Prediction',
    'Question',
    'REALISTIC_LINK_SHARE',
    'RefreshRefused',
    'ThirteenBCase',
    'Workload',
    'bars',
    'bert_large',
    'check_all',
    'check_options',
    'close',
    'cost_calculator',
    'ddp_timeline',
    'evaluate',
    'expect',
    'global_batch',
    'grade',
    'has_checked_outputs',
    'issue',
    'keyed_lab',
    'learner_notebook',
    'legend_outside',
    'load_lab',
    'main',
    'memory_timeline',
    'mfu_calculator',
    'mystery_run',
    'nbval_command',
    'new_axes',
    'note',
    'output_problems',
    'parse',
    'prepare_nbval',
    'public_record',
    'read_key',
    'refresh',
    'release',
    'ring_allreduce',
    'roofline',
    'run',
    'scaling',
    'scaling_calculator',
    'si',
    'stacked_parts',
    'thirteen_b',
    'warnings_markdown',
    'widgets_available',
    'write_tickets',
]
_FALLBACK = None   # the file whose every attribute the face also hands out (its old module path)


def __getattr__(name: str):
    if name in _NAMES:
        return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    if name in _FILES:
        return importlib.import_module(f"{__name__}.{name}")
    if _FALLBACK and not name.startswith("__"):
        module = importlib.import_module(f"{__name__}.{_FALLBACK}")
        if hasattr(module, name):
            return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_FILES) | set(__all__))
