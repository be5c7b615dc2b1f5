"""Training with Lightning: runs as packs (a single run is a pack of one), Lightning's single path, the objective,
AdamW, callbacks, loggers and records. Nothing is imported here: light modules of it (optim, cores) load without
torch.
"""
