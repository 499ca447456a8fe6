"""The course's two seed cases, told once: the source's numbers (cited), what follows from them, and where
the source contradicts itself (⚠).

Chapters quote these objects, never their own copies of the numbers (issue #14: the cases had drifted
apart between chapters). Each case stores **only the source's inputs**; every speedup, efficiency, step
time and link speed is computed here, by the formula beside it. What a model adds (``labkit.perf``) is
labelled *modelled* and kept apart from what the source reported.

- :func:`bert_large` — BERT-large on 4 (and 8) GPUs. Taught in chapters 5, 11, 14 and 30.
- :func:`thirteen_b` — a 13B model on 64 → 128 A100 over 25 Gb/s Ethernet, 1.8k tokens/s per GPU on 64.
  Taught in chapters 14, 24 and 29 (its bandwidth figures in chapter 11).
- :func:`warnings_markdown` — a case's ⚠ records as Markdown boxes for a chapter.

The source document itself is not shipped: its numbers are quoted here, field by field, and each case's
``sources`` names what else it cites (papers, specifications, public pages with their address).
"""
from __future__ import annotations

import sys
import types

from labkit.teaching.cases._common import CaseWarning, warnings_markdown
from labkit.teaching.cases.bert import LINKS, REALISTIC_LINK_SHARE, BertLargeCase, bert_large
from labkit.teaching.cases.thirteen_b import LLAMA_13B_SHAPE, ThirteenBCase, thirteen_b

__all__ = ["CaseWarning", "BertLargeCase", "ThirteenBCase", "bert_large", "thirteen_b", "warnings_markdown",
           "LINKS", "REALISTIC_LINK_SHARE", "LLAMA_13B_SHAPE"]


class _Face(types.ModuleType):
    """This package's module type: importing its submodule ``thirteen_b`` again under another name (the old path
    ``labkit.cases.thirteen_b``, which labkit._compat answers) makes Python set the package's attribute to the
    module; the face keeps the function :func:`thirteen_b` it re-exports."""

    def __setattr__(self, name, value):
        if isinstance(value, types.ModuleType) and callable(self.__dict__.get(name)):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Face
