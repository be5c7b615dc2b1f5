"""Tables printed for a person: fitted to the screen on a terminal, whole in a pipe or a file.

On a terminal a table is Rich's, its cells folded or cut to fit the width; where stdout is a pipe or a file
(`headlab-heads RUN > out.txt`, `| less`) nothing is cut: a Markdown table of whole values, as compare.md and
statistics.csv hold them. Every cell is received text: shown as written (no markup, no escape sequence, no row
break).
"""

import re
import sys
from dataclasses import dataclass

from headlab.escape import terminal


def duration(seconds: float) -> str:
    """A duration as a person reads it: seconds below 90 s, minutes below 90 min, then hours and minutes."""
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    minutes = round(seconds / 60)  # 7,199 s: 2 h 0 min, not 1 h 60 min
    return f"{minutes // 60} h {minutes % 60} min"


DURATION = re.compile(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


def seconds_of(text) -> float | None:
    """A duration as a person writes it, '30m', '2h', '1h30m', '90s' (or a number of seconds), in seconds; None
    for anything else (or no time at all)."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        return float(text) if text > 0 else None
    found = DURATION.fullmatch(str(text).strip())
    if not found or not any(found.groups()):
        return None
    hours, minutes, seconds = (int(g or 0) for g in found.groups())
    return float(3600 * hours + 60 * minutes + seconds) or None


def _cell(text) -> str:
    """A cell of a table read as text (a file, a pager): one line, no cell separator, no control character; not
    HTML-escaped, as compare.md's cells are (nothing renders it)."""
    return terminal(" ".join(str(text).splitlines())).replace("|", "\\|")


@dataclass
class Column:
    name: str
    fit: str = "fold"  # on a terminal: "fold" (wrapped), "cut" (an ellipsis), or "word" (as wide as its longest word)


def print_table(title: str, columns: list[Column], rows: list[list[str]], width: int = 130) -> None:
    """The table on stdout: Rich's at least `width` characters wide on a terminal, else Markdown."""
    if not sys.stdout.isatty():
        lines = [f"{_cell(title)}:", "", "| " + " | ".join(_cell(c.name) for c in columns) + " |"]
        lines.append("|" + "---|" * len(columns))
        lines += ["| " + " | ".join(_cell(cell) for cell in row) + " |" for row in rows]
        print("\n".join(lines) + "\n")
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(terminal(title)), expand=any(c.fit == "fold" for c in columns))
    for i, c in enumerate(columns):
        if c.fit == "word":  # a number is never split
            longest = max(len(word) for text in (c.name, *(r[i] for r in rows)) for word in text.split() or [""])
            table.add_column(escape(terminal(c.name)), overflow="fold", min_width=longest, max_width=longest)
        elif c.fit == "fold":
            table.add_column(escape(terminal(c.name)), overflow="fold", ratio=1)
        else:
            table.add_column(escape(terminal(c.name)), justify="right")
    for row in rows:
        table.add_row(*(escape(terminal(cell)) for cell in row))
    Console(width=max(Console().width, width)).print(table)
