"""Training with Lightning and Hydra: the LightningModule, callbacks, loggers, one run, sweeps, results.

Nothing is imported here: the config check (training.config_check) must load without torch or Lightning.
"""
