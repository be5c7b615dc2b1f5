"""Text from a received file, made inert for where it is written: a terminal, a Markdown table, a CSV cell.

A run's name, a head's role, a verdict cell of someone else's table are data; none may move the cursor, open a
heading or a tag, break a table's row or start a spreadsheet formula. Standard library only: every layer writes.
"""

import html
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
    """text as one cell of a Markdown table in a page that may render HTML: control characters escaped, no tag,
    no row break (|), no line of its own (a heading, a list)."""
    return html.escape(terminal(text), quote=False).replace("|", "\\|")


def csv_cell(text) -> str:
    """text that a spreadsheet reads as text: one that would start a formula (and is no number, such as -0.5)
    gets a leading apostrophe."""
    text = str(text)
    return "'" + text if text.startswith(_FORMULA) and not _NUMBER.fullmatch(text) else text
