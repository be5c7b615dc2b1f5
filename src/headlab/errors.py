"""Errors that are the user's to fix: reported in one line, without a traceback, with exit code 2."""


class UsageError(ValueError):
    """A wrong setting or input; str() is the one line shown to the user."""


class ConfigError(UsageError):
    """An invalid configuration value."""


class DataError(UsageError):
    """Data that cannot be read or does not fit the configuration."""
