"""Tables inside a markdown file (experiments/RESULTS.md): each in its block, between the lines
<!-- headlab-compare: NAME --> and <!-- /headlab-compare: NAME -->, which headlab-compare --into fills with the
table's compare.md in brief: the file states the method once, and the compare.md the block links to keeps every
column, interval and test."""

import os
import re
from pathlib import Path

from headlab.files import write_atomic
from headlab.stats.contrasts import CompareError

# compare.md's paragraphs a block leaves to it: the legend (the file states it once, in its findings block), how
# the intervals, tests and pooling were made, how the runs were packed, and the keys that follow the dataset
LEFT_OUT = ("Verdicts: ", "Cross-validated runs: ", "Intervals: ", "Speed: ")
FOLLOWING = "Keys that follow "  # a paragraph and its list of "- " lines
PROVENANCE = ("headlab commit (compare): ", "Runs' commits: ", "Runs' hardware: ")
COSTS = ("params", "FLOPs/token", "train FLOPs (mean)", "train tokens/s")  # columns a block leaves to compare.md
DETAIL = (  # (pattern, replacement): what a block's cell leaves to compare.md
    (r" \(sd [^)]*\)", ""),  # the standard deviation
    (r" p=\S+ \(Holm ", " (Holm "),  # the unadjusted p beside the Holm-adjusted one
    (r" at 80%(; 80% needs [^)]*)?\)", ")"),  # the replicates 80% power needs
    (r" \(80% needs [^)]*\)", ""),
    (r" \(power \S+ at ±[^;)]+(; 80% needs [^)]*)?\)", ""),  # the power behind a verdict with a margin
    (r" improving: (not )?converged$", ""),  # k/n: the column's header says what it counts
    (r" \(edge of its grid [^)]*\)", " (grid's edge)"),
    (r"^(\S+) \[[^]]*\] \(gap (\S+)( \[[^]]*\])?\)$", r"\1 (gap \2)"),  # a setting's gap: its target column reads it
)
TITLES = (  # (pattern, replacement): a paragraph of method before a table, left as the table's title
    (r"^(Pooled over the values of \S+) \(.*", r"\1 (random effects; compare.md states how):"),
    (r"^(Settings across the values of \S+ \(k = \d+\)): .*", r"\1 (compare.md states how they are read):"),
)
FEW = (r" of a metric: .*?\. A standard deviation ", " of a metric (compare.md names them). A standard deviation ")
_SPLIT = re.compile(r"(?<!\\)\|")  # a table's cell separator; received text has its | escaped (escape.py)


def brief(table: str, into: Path, folder: Path) -> str:
    """A compare.md as a block of `into` shows it: its command and one line of provenance ending in a link to
    compare.md for the rest, its findings and tables, less the costs' columns, the keys a named choice sets
    (model.attention.* beside `design`), standard deviations and unadjusted p-values. With --across, the table of
    every arm on every dataset is compare.md's alone: the settings table gives each setting's mean per dataset.
    folder: where the table's compare.md lies."""
    body, implied = [], set()
    for block in _runs(_kept(table.strip().splitlines())):
        if block[0].startswith("|"):
            block, implied = _brief_table(block, implied)
        body += [_detail(line) for line in block]
    where = Path(os.path.relpath(folder.resolve() / "compare.md", into.resolve().parent)).as_posix()
    link = f"every column, interval and test: [{where}]({where})"
    made = next((i for i, line in enumerate(body) if line.startswith("Made by headlab ")), None)
    if made is None:  # a table from before compare.md said its provenance
        body += ["", link[0].upper() + link[1:]]
    else:
        body[made] += f"; {link}"
    return re.sub(r"\n{3,}", "\n\n", "\n".join(body)).strip()


def _kept(lines: list[str]) -> list[str]:
    """The lines a block keeps: the provenance in one line, without the paragraphs compare.md keeps (LEFT_OUT, the
    keys that follow the dataset) and, under --across, without the first table (every arm on every dataset)."""
    across = any(line.startswith("Settings across ") for line in lines)
    kept, tables, following, provenance, previous = [], 0, False, [], ""
    for line in [*lines, ""]:
        following = line.startswith(FOLLOWING) or (following and line.startswith("- "))
        if line.startswith(PROVENANCE):
            provenance.append(line)
            continue
        if provenance:
            kept.append(_provenance(provenance))
            provenance = []
        tables += line.startswith("|") and not previous.startswith("|")
        previous = line
        if not (following or line.startswith(LEFT_OUT) or (line.startswith("|") and across and tables == 1)):
            kept.append(line)
    return kept


def _runs(lines: list[str]) -> list[list[str]]:
    """lines as runs of table lines and of other lines."""
    runs: list[list[str]] = []
    for line in lines:
        if runs and runs[-1][0].startswith("|") == line.startswith("|"):
            runs[-1].append(line)
        else:
            runs.append([line])
    return runs


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in _SPLIT.split(line.strip())[1:-1]]


def _brief_table(lines: list[str], implied: set[str]) -> tuple[list[str], set[str]]:
    """A table less its costs' columns, the metric its learning rates were selected on (beside test metrics) and
    the key columns that a named choice (a key without a dot, such as design) sets; an `arm` column's pairs lose
    those keys too. Returns the lines and the keys left out."""
    header, rows = _cells(lines[0]), [_cells(line) for line in lines[2:]]
    if any(len(row) != len(header) for row in rows):  # not a table compare writes: shown as it is
        return lines, implied
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in header]
    keys = header.index("runs") if "runs" in header else 0  # the arm's keys stand before its runs
    named = [c for c in range(keys) if re.fullmatch(r"\w+", header[c]) and len(set(columns[c])) > 1]
    for c, h in enumerate(header[:keys]):
        if "." in h and re.fullmatch(r"[\w.]+", h) and any(_follows(columns[c], columns[n]) for n in named):
            implied = implied | {h}
    chosen = {m.group(1) for h in header if (m := re.search(r"\(selected on (\S+)\)", h))}  # beside test metrics
    chose = {h for h in header if h.split(" (")[0] in chosen} if any(h.startswith("test/") for h in header) else set()
    keep = [c for c, h in enumerate(header) if h not in COSTS and h not in implied and h not in chose]
    arm = header.index("arm") if "arm" in header else None

    def row(cells: list[str]) -> str:
        if arm is not None:
            pairs = cells[arm].split(", ")
            cells = [*cells[:arm], ", ".join(p for p in pairs if p.split("=")[0] not in implied), *cells[arm + 1 :]]
        return "| " + " | ".join(cells[c] for c in keep) + " |"

    return [row(header), "|" + "---|" * len(keep), *(row(r) for r in rows)], implied


def _follows(column: tuple, named: tuple) -> bool:
    """Whether each value of the named column goes with one value of column."""
    return len(set(zip(named, column, strict=True))) == len(set(named))


def _detail(line: str) -> str:
    if not line.startswith("|"):
        for pattern, replacement in (FEW, *TITLES):
            line = re.sub(pattern, replacement, line)
        return line
    if set(line) <= set("|-"):  # the header's rule
        return line
    cells = _cells(line)
    for pattern, replacement in DETAIL:
        cells = [re.sub(pattern, replacement, cell) for cell in cells]
    return "| " + " | ".join(cells) + " |"


def _provenance(lines: list[str]) -> str:
    """The commit of headlab, the runs' commits and hardware in one line, commits as 12 characters."""
    said = dict(line.split(": ", 1) for line in lines)
    commit, runs, hardware = (
        re.sub(r"\b([0-9a-f]{12})[0-9a-f]{28}\b", r"\1", said.get(p[:-2], "?")) for p in PROVENANCE
    )
    return f"Made by headlab {commit} from runs at {runs}, on {hardware}"


def splice(path: Path, name: str, table: str, folder: Path) -> None:
    """Put a table (its compare.md, in brief, from folder) into the block NAME of a markdown file, replacing what
    was there."""
    put(path, f"<!-- headlab-compare: {name} -->", f"<!-- /headlab-compare: {name} -->", brief(table, path, folder))


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


def holding(into: Path, table: str, folder: Path) -> str | None:
    """The name of the block of `into` that holds the table (its compare.md, from folder): the block that shows it,
    or, where the way a block shows a table has changed since, the one that links its compare.md."""
    blocks = r"<!-- headlab-compare: (\S+) -->\n(.*?)<!-- /headlab-compare: \1 -->"
    found = re.findall(blocks, into.read_text(), re.S)
    where = Path(os.path.relpath(folder.resolve() / "compare.md", into.resolve().parent)).as_posix()
    shown = brief(table, into, folder)
    for name, body in found:
        if shown in body:
            return name
    return next((name for name, body in found if f"]({where})" in body), None)


def pasted(into: Path) -> list[int]:
    """The lines of into that start a table (its Command line) outside every block."""
    inside, lines = False, []
    for number, line in enumerate(into.read_text().splitlines(), 1):
        if line.startswith(("<!-- headlab-compare: ", "<!-- /headlab-compare: ")):
            inside = line.startswith("<!-- headlab-compare: ")
        elif line.startswith("Command: `headlab-compare ") and not inside:
            lines.append(number)
    return lines
