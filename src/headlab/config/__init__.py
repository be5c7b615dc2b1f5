"""A run's configuration before anything trains: the whole config's check (check.py: one line naming the key, the
value and what is allowed; what a pack can train) and the config as flat dotted keys, composed now or as a run
recorded it (run_config.py). Every launcher and the training itself use it; it loads without torch or Lightning.
"""
