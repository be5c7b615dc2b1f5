"""Values of the command-line tools' options, checked where they are parsed: a bad one is argparse's one line
naming the option, the value and what is allowed, and exit 2, before anything is read or run."""

import argparse
import math


def at_least(low: int):
    """An integer of at least `low`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"{text!r} is invalid: expected an integer >= {low}")
        return value

    return parse


def positive_number(text: str) -> float:
    """A finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: expected a finite number > 0")
    return value
