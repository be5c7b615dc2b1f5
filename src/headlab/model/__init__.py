"""The models: multi-head attention with a configurable head split, and the Transformer encoder built on it.

Pure torch (no Lightning, Hydra, W&B or datasets):

    from headlab.model import MultiHeadAttention, Encoder
"""

from headlab.model.attention import MultiHeadAttention, head_sizes
from headlab.model.dropout import Dropout
from headlab.model.encoder import Encoder, count_parameters, describe, flops_per_token, training_flops_per_token

__all__ = [
    "Dropout",
    "Encoder",
    "MultiHeadAttention",
    "count_parameters",
    "describe",
    "flops_per_token",
    "head_sizes",
    "training_flops_per_token",
]
