"""What each head learned: per-head statistics, importance and pruning, what a head does causally (ablation,
activation patching, roles), figures and the head view.

Pure torch, numpy and matplotlib (no Lightning, Hydra, W&B or datasets).
"""
