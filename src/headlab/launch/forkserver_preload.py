"""What the packed launcher's forkserver imports before it forks a worker for each pack (workers.PRELOAD): the
pack's training, torch and Lightning with it, imported as runtime.heavy_imports imports them, so that each worker
starts with them imported and frozen out of the garbage collector's passes."""

from headlab.launch import runtime

with runtime.heavy_imports():
    import headlab.training.pack.train  # noqa: F401
