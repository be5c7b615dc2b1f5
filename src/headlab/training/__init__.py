"""Training with Lightning: runs as packs (a single run is a pack of one), what a run is built from, the objective,
AdamW, callbacks, loggers and records. Nothing is imported here: light modules of it (optim, cores) load without
torch.
"""
