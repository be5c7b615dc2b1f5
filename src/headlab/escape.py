"""Text from a received file, made inert for where it is written: a terminal, a Markdown table, a CSV cell.

A run's name, a head's role, a verdict cell of someone else's table are data; none may move the cursor, open a
heading or a tag, break a table's row or start a spreadsheet formula. Standard library only: every layer writes.
"""

import re
import unicodedata

_FORMULA = ("=", "+", "-", "@", "\t", "\r")  # a cell a spreadsheet would evaluate (OWASP's CSV injection)
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _invisible(char: str) -> bool:
    """Control characters (escape sequences, carriage returns) and format characters (bidirectional overrides)."""
    return unicodedata.category(char) in ("Cc", "Cf")


def terminal(text) -> str:
    """text with every control or format character written as its escape (ESC as \\x1b, a newline as \\n)."""
    return "".join(char.encode("unicode_escape").decode() if _invisible(char) else char for char in str(text))


def markdown_cell(text) -> str:
    """text as one cell of a Markdown table that stays text: no line breaks (a heading, a list), no cell
    separators, no HTML (a marker such as <!-- /headlab-compare: x --> or a tag is shown, not read), no control
    characters."""
    text = terminal(" ".join(str(text).splitlines()))
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def csv_cell(value):
    """A value for a CSV cell that a spreadsheet shows as text: a string that would start a formula
    (=HYPERLINK(...), +, -, @) and is no number (such as -0.5) gets a leading apostrophe; other values as they are."""
    if isinstance(value, str) and value.startswith(_FORMULA) and not _NUMBER.fullmatch(value):
        return "'" + value
    return value
