"""Statistics over runs: reading runs' records (runs, archive), grouping and comparing arms (comparison, contrasts,
inference, power, survival, budget), pooling over datasets (datasets, meta), test predictions, head roles per arm.

numpy and scipy only (no Lightning, Hydra, W&B or datasets).
"""
