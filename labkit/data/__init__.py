"""Data: the course corpus, its token file, a packed dataset and the DataLoader — and the loader measured
alone.

- ``corpus`` — the corpus, its tokens, a packed token dataset, a DataLoader factory (chapter 22);
- ``loading`` — measuring the data-loading pipeline: the loader alone, worker sweeps, epoch restarts, pinning, padding waste (chapter 22).

``from labkit.data import <name>`` works for every name in ``__all__``; inside labkit, import the file
(``labkit.data.<file>``).
"""
from __future__ import annotations

from labkit import _compat

# The face hands each name out from the file that defines it, imported on first use
# (so importing one file of the package never imports the others, nor torch).
_FILES = ('corpus', 'loading')
_NAMES = {
    'OnTheFlyDataset': 'corpus',
    'PaddedDataset': 'corpus',
    'SlowDataset': 'corpus',
    'TokenDataset': 'corpus',
    'document_lengths': 'corpus',
    'documents': 'corpus',
    'load_tokens': 'corpus',
    'make_loader': 'corpus',
    'token_file': 'corpus',
    'tokenizer': 'corpus',
    'vocab_size': 'corpus',
    'LoaderTiming': 'loading',
    'epoch_starts': 'loading',
    'padding_waste': 'loading',
    'pin_memory_probe': 'loading',
    'real_target_share': 'loading',
    'source_num_workers': 'loading',
    'sweep_workers': 'loading',
    'time_loader': 'loading',
    'workers_needed': 'loading',
}
__all__ = [
    'LoaderTiming',
    'OnTheFlyDataset',
    'PaddedDataset',
    'SlowDataset',
    'TokenDataset',
    'document_lengths',
    'documents',
    'epoch_starts',
    'load_tokens',
    'make_loader',
    'padding_waste',
    'pin_memory_probe',
    'real_target_share',
    'source_num_workers',
    'sweep_workers',
    'time_loader',
    'token_file',
    'tokenizer',
    'vocab_size',
    'workers_needed',
]
_FALLBACK = 'corpus'   # the file whose every attribute the face also hands out (its old module path)

__getattr__, __dir__ = _compat.lazy_face(__name__, _NAMES, _FILES, __all__, _FALLBACK)
