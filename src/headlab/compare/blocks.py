"""Tables inside a markdown file (experiments/RESULTS.md): each in its block, between the lines
<!-- headlab-compare: NAME --> and <!-- /headlab-compare: NAME -->, which headlab-compare --into fills with the
table's compare.md less its legend (LEGEND: the file states it once, in its findings block)."""

import re
from pathlib import Path

from headlab.files import write_atomic
from headlab.stats.contrasts import CompareError

LEGEND = ("Verdicts: ", "Cross-validated runs: ")  # compare.md's paragraphs that a file holding tables states once


def shown(table: str) -> str:
    """A compare.md as a block of a file shows it: without the legend's paragraphs."""
    return "\n".join(line for line in table.strip().splitlines() if not line.startswith(LEGEND))


def splice(path: Path, name: str, table: str) -> None:
    """Put a table (its compare.md, shown without its legend) into the block NAME of a markdown file, replacing
    what was there."""
    put(path, f"<!-- headlab-compare: {name} -->", f"<!-- /headlab-compare: {name} -->", shown(table))


def put(path: Path, start: str, end: str, text: str) -> None:
    """Put text between the lines start and end of a markdown file, replacing what was there."""
    try:
        document = path.read_text()
    except OSError as error:
        raise CompareError(f"--into {path}: {error.strerror}") from None
    if document.count(start) != 1 or document.count(end) != 1 or document.index(start) > document.index(end):
        raise CompareError(f"--into {path} needs one block from {start} to {end}")
    head, rest = document.split(start, 1)
    spliced = f"{head}{start}\n{text.strip()}\n{end}{rest.split(end, 1)[1]}".encode()
    write_atomic(path, lambda f: f.write(spliced))  # a full disk or a kill leaves the file as it was


def holding(into: Path, table: str) -> str | None:
    """The name of the block of `into` that holds the table."""
    blocks = r"<!-- headlab-compare: (\S+) -->\n(.*?)<!-- /headlab-compare: \1 -->"
    for name, body in re.findall(blocks, into.read_text(), re.S):
        if shown(table) in shown(body):
            return name
    return None


def pasted(into: Path) -> list[int]:
    """The lines of into that start a table (its Command line) outside every block."""
    inside, lines = False, []
    for number, line in enumerate(into.read_text().splitlines(), 1):
        if line.startswith(("<!-- headlab-compare: ", "<!-- /headlab-compare: ")):
            inside = line.startswith("<!-- headlab-compare: ")
        elif line.startswith("Command: `headlab-compare ") and not inside:
            lines.append(number)
    return lines
