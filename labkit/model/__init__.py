"""The model and its shape: the GPT the course trains, its configuration, and the shapes FLOPs are counted
from.

- ``gpt`` — the decoder-only GPT (nanoGPT-like), single-device PyTorch (chapter 4);
- ``config`` — ``GPTConfig`` and the named sizes, torch-free (chapter 4);
- ``shapes`` — ``ModelShape`` from Hugging Face configs, FLOPs from a bare N, a formula beside an exact count (chapter 3);
- ``moe`` — the mixture-of-experts MLP: top-k router, experts, balance loss (chapter 26);
- ``expert_load`` — load statistics of a MoE layer's routing counts, torch-free (chapter 26);
- ``recompute_policy`` — activation-checkpointing policies by name: which blocks recompute (chapter 21).

``from labkit.model import <name>`` works for every name in ``__all__``; inside labkit, import the file
(``labkit.model.<file>``).
"""
from __future__ import annotations

from labkit import _compat

# The face hands each name out from the file that defines it, imported on first use
# (so importing one file of the package never imports the others, nor torch).
_FILES = ('gpt', 'config', 'shapes', 'moe', 'expert_load', 'recompute_policy')
_NAMES = {
    'ATTENTIONS': 'config',
    'GPTConfig': 'config',
    'SIZES': 'config',
    'gpt_config': 'config',
    'balance_loss': 'expert_load',
    'load_imbalance': 'expert_load',
    'Block': 'gpt',
    'CausalSelfAttention': 'gpt',
    'GPT': 'gpt',
    'MLP': 'gpt',
    'AllToAll': 'moe',
    'MoE': 'moe',
    'all_to_all': 'moe',
    'aux_loss': 'moe',
    'moe_layers': 'moe',
    'CHECKPOINT_POLICIES': 'recompute_policy',
    'checkpoint_policy': 'recompute_policy',
    'checkpointed_blocks': 'recompute_policy',
    'recompute_mode': 'recompute_policy',
    'recompute_share': 'recompute_policy',
    'HF_MODEL_TYPES': 'shapes',
    'compare': 'shapes',
    'flops_per_token_from_params': 'shapes',
    'from_hf_config': 'shapes',
}
__all__ = [
    'ATTENTIONS',
    'AllToAll',
    'Block',
    'CHECKPOINT_POLICIES',
    'CausalSelfAttention',
    'GPT',
    'GPTConfig',
    'HF_MODEL_TYPES',
    'MLP',
    'MoE',
    'SIZES',
    'all_to_all',
    'aux_loss',
    'balance_loss',
    'checkpoint_policy',
    'checkpointed_blocks',
    'compare',
    'flops_per_token_from_params',
    'from_hf_config',
    'gpt_config',
    'load_imbalance',
    'moe_layers',
    'recompute_mode',
    'recompute_share',
]
_FALLBACK = None   # the file whose every attribute the face also hands out (its old module path)

__getattr__, __dir__ = _compat.lazy_face(__name__, _NAMES, _FILES, __all__, _FALLBACK)
