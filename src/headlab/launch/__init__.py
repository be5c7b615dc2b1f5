"""Runs and launches: a job's life (job), its run directory (rundir), packs (packs, workers), SLURM (slurm,
pack_slurm), the grid's extension rounds (grid) and a sweep's summary (summary). The Hydra plugins are shells over
this package; the console scripts call into it."""
