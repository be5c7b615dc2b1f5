"""A console script whose output may be piped into a reader that stops early."""

import functools
import os
import sys


def piped(main):
    """A console script whose reader may stop reading (`headlab-status DIR | head`): it ends quietly, as cat does,
    with the shell's code for a closed pipe (141), not a traceback."""

    @functools.wraps(main)
    def run(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the flush at exit has nowhere to fail
            sys.exit(141)

    return run
