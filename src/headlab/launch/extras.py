"""The launch modules that need an optional extra, each imported where it is installed or refused in one line."""

from types import ModuleType

from headlab.errors import ConfigError


def search() -> ModuleType:
    """headlab.launch.search (hydra/sweeper=search), which needs the optuna extra."""
    try:
        from headlab.launch import search as module
    except ImportError as error:
        raise ConfigError(f"hydra/sweeper=search needs Optuna ({error.msg}): pip install 'headlab[optuna]'") from None
    return module
