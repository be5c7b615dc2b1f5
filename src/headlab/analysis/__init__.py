"""What each head learned: per-head statistics, head similarity, importance, pruning curves, and figures.

Pure torch, numpy and matplotlib (no Lightning, Hydra, W&B or datasets).
"""
