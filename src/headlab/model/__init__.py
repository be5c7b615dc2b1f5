"""The models: multi-head attention with a configurable head split, and the Transformer encoder built on it.

Pure torch (no Lightning, Hydra, W&B or datasets):

    from headlab.model import MultiHeadAttention, Encoder

The names below are imported when first used, so that headlab.model.rules (the model's rules, torch-free) can be
imported by the config check without importing torch.
"""

import importlib

_WHERE = {
    "Dropout": "headlab.model.dropout",
    "Encoder": "headlab.model.encoder",
    "MultiHeadAttention": "headlab.model.attention",
    "count_parameters": "headlab.model.encoder",
    "describe": "headlab.model.encoder",
    "flops_per_token": "headlab.model.encoder",
    "training_flops_per_token": "headlab.model.encoder",
    "head_sizes": "headlab.model.rules",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'headlab.model' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
