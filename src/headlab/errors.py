"""Errors that are the user's to fix: reported in one line, without a traceback, with exit code 2."""


def as_written(value) -> str:
    """A value as a user writes it in an override (null, true, false; strings quoted, numbers as they are)."""
    for constant, written in ((None, "null"), (True, "true"), (False, "false")):
        if value is constant:  # identity: 1 == True, and 1 is no `true`
            return written
    return repr(value)


def fail(key: str, value, allowed: str) -> None:
    """A config's invalid value, in one line: key=value is invalid: expected what is allowed."""
    raise ConfigError(f"{key}={as_written(value)} is invalid: expected {allowed}")


class UsageError(ValueError):
    """A wrong setting or input; str() is the one line shown to the user."""


class ConfigError(UsageError):
    """An invalid configuration value."""


class InvalidSetting(ConfigError):
    """A setting that breaks a rule of the model or of a task, raised by the rule itself (headlab.model.rules, a
    task's check): `key` names the setting as the caller named it, so that the config check can name the config
    key and the model its own argument."""

    def __init__(self, key: str, value, expected: str):
        self.key, self.value, self.expected = key, value, expected
        super().__init__(f"{key}={as_written(value)} is invalid: expected {expected}")


class DataError(UsageError):
    """Data that cannot be read or does not fit the configuration."""


class TrainingError(UsageError):
    """Training that cannot go on with these settings (a non-finite loss)."""


class DiskFull(TrainingError):
    """No space left on the device for a run's files (the previous version of the file is left whole)."""


def first_line(error: BaseException) -> str:
    """An error as "Type: first line of its message", for messages that must stay on one line."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
