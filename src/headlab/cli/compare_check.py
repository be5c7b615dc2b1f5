"""headlab-compare --check [PATH...]: recompute every committed table from the run archive kept beside it.

Each compare.md records the command that wrote it. --check replays that command on the runs' archive (the
command's own --archive, or, for a table read from the same directories as an archived one, that archive) into a
temporary folder and compares the table rows (every line of compare.md that starts with "|": numbers, intervals,
tests and verdicts) with the committed ones; where the command put the table into a file (--into), it also checks
that the file's block still holds compare.md, and that the file holds no table outside such blocks (a pasted copy
would go stale unseen). The replay drops the command's --out, --into, --block and --archive, so nothing is written
beside the tables. Exit 1 when a table differs or cannot be replayed; tables whose runs were never archived are
listed and do not fail the check.

--update rewrites each table that differs from its archive instead (compare.md, compare.csv and the plots in its
folder, and its block of the --into file, which must lie below the working directory), recording the archive as the
command's source: after a change to the analysis, `headlab-compare --check --update` and `git diff` show what it
changed in every published table.
"""

import contextlib
import difflib
import io
import os
import re
import shlex
import tempfile
from pathlib import Path

from headlab.analysis import archive

WRITES = ("--out", "--into", "--block", "--archive")  # where a command writes: the replay sets --out, drops the rest


def command(table: Path) -> list[str] | None:
    """The argv (after headlab-compare) recorded in a compare.md's Command line, or None."""
    for line in table.read_text().splitlines():
        if line.startswith("Command: `headlab-compare ") and line.endswith("`"):
            return shlex.split(line[len("Command: `headlab-compare ") : -1])
    return None


def split(argv: list[str]) -> tuple[list[str], list[str], dict[str, str]]:
    """(sources, analysis options, {--out/--into/--block/--archive: its value}) of a recorded command."""
    from headlab.cli.compare import make_parser

    flags = {s for action in make_parser()._actions if action.nargs == 0 for s in action.option_strings}
    sources, options, writes = [], [], {}
    words = iter(argv)
    for word in words:
        flag, eq, value = word.partition("=")
        if not word.startswith("--"):
            sources.append(word)
        elif flag in WRITES:
            writes[flag] = value if eq else next(words, "")
        else:
            options += [word] if eq or flag in flags else [word, next(words, "")]
    return sources, options, writes


def resolve(path: str, table: Path) -> Path | None:
    """A path of a recorded command, relative to where it was run: the working directory or a folder above the
    table (the repository's root, for experiments/results/...)."""
    for base in [Path.cwd(), *table.resolve().parents]:
        if (base / path).exists():
            return base / path
    return None


def check(paths: list[Path], update: bool = False) -> int:
    """Replay every compare.md below the paths; print one line per table; 0 when all archived tables agree (or,
    with update, were rewritten from their archives)."""
    tables = sorted({t for p in paths for t in ([p] if p.is_file() else p.rglob("compare.md"))})
    if not tables:
        print(f"headlab-compare --check: no compare.md below {', '.join(map(str, paths))}")
        return 1
    recorded = {t: split(argv) if (argv := command(t)) is not None else None for t in tables}
    archived = {}  # the sources of each archiving command -> their archive
    for table, (sources, _, writes) in ((t, r) for t, r in recorded.items() if r):
        if "--archive" in writes and (found := resolve(writes["--archive"], table)):
            archived[tuple(sources)] = found
    failed = 0
    for table, parts in recorded.items():
        verdict, detail = _check(table, parts, archived, update)
        failed += verdict in ("differs", "failed")
        print(f"{verdict}: {table}" + (f" ({detail})" if detail else ""))
    intos = {(parts[2].get("--into"), table) for table, parts in recorded.items() if parts}
    for file in sorted({found for into, table in intos if into and (found := resolve(into, table))}):
        for line in _pasted(file):
            failed += 1
            print(
                f"differs: {_shown(file)}:{line} (a table pasted outside a headlab-compare block, which --check "
                f"cannot keep true: write it with --into {_shown(file)} --block NAME)"
            )
    return 1 if failed else 0


def _check(table: Path, parts: tuple | None, archived: dict, update: bool) -> tuple[str, str]:
    """One table against its archive: (same | differs | failed | not archived | updated, what was found)."""
    if parts is None:
        return "failed", "no Command line"
    sources, options, writes = parts
    if any(o.startswith("--wandb") for o in options):
        return "not archived", "read from W&B"
    if tuple(sources) in archived:
        inputs = [archived[tuple(sources)]]
    elif sources and all(s.endswith(archive.SUFFIXES) and resolve(s, table) for s in sources):
        inputs = [resolve(s, table) for s in sources]
    else:
        return "not archived", "its runs were not kept"
    repeated = {_shown(i): n for i in inputs if i.is_file() and (n := len(archive.duplicates(i)))}
    if repeated and update:
        for source in repeated:
            archive.rebuild(Path(source))
    elif repeated:  # tar -x would keep one of each: a sweep continued from it would lose runs
        where = ", ".join(f"{s} ({n} members twice)" for s, n in repeated.items())
        return "differs", f"{where}: each copy needs a root of its own (--check --update rebuilds it)"
    options = [o for o in options if o != "--confirm"]  # the recorded command holds the stated analysis already
    into = resolve(writes["--into"], table) if "--into" in writes else None
    committed = table.read_text()
    try:
        again = _compare([*map(_shown, inputs), *options], None)
    except SystemExit as error:
        return "failed", str(error.code)
    if _rows(again) == _rows(committed) and (into is None or committed.strip() in into.read_text()):
        rebuilt = f"; rebuilt {', '.join(repeated)} with a root for each copy" if repeated else ""
        return "same", f"{len(_rows(committed))} table lines from {', '.join(map(_shown, inputs))}{rebuilt}"
    if not update:
        if _rows(again) != _rows(committed):
            return "differs", "\n" + _diff(_rows(committed), _rows(again))
        return "differs", f"{writes['--into']} no longer holds this table"
    if into and not into.resolve().is_relative_to(Path.cwd().resolve()):
        return "failed", f"--into {writes['--into']} lies outside the working directory: not written"
    block = _block(into, committed) if into else None
    if into and block is None:
        return "failed", f"no block of {writes['--into']} holds this table: put it back first"
    again = _compare([*map(_shown, inputs), *options, "--out", _shown(table.parent)], table.parent)
    if block:
        from headlab.cli.compare import splice

        splice(into, block, again)
    return "updated", f"from {', '.join(map(_shown, inputs))}" + (
        f" and its block {block} of {_shown(into)}" if block else ""
    )


def _compare(argv: list[str], out: Path | None) -> str:
    """headlab-compare argv, quietly; its compare.md (written into out with its figures, or, tables only, into a
    temporary folder)."""
    from headlab.cli.compare import main

    with tempfile.TemporaryDirectory() as temporary, contextlib.redirect_stdout(io.StringIO()) as said:
        with contextlib.redirect_stderr(said):
            main(argv if out else [*argv, "--out", temporary, "--no-plots"])
        return ((out or Path(temporary)) / "compare.md").read_text()


def _rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


def _diff(committed: list[str], again: list[str]) -> str:
    """The first three rows that changed, committed and recomputed, or the whole unified diff of the rows."""
    if len(committed) != len(again):
        return "\n".join(list(difflib.unified_diff(committed, again, "committed", "recomputed", lineterm=""))[2:14])
    changed = [(a, b) for a, b in zip(committed, again, strict=True) if a != b]
    more = f"\n(and {len(changed) - 3} rows more)" if len(changed) > 3 else ""
    return "\n".join(f"- {a}\n+ {b}" for a, b in changed[:3]) + more


def _block(into: Path, committed: str) -> str | None:
    """The name of into's <!-- headlab-compare: NAME --> block that holds the committed table."""
    blocks = r"<!-- headlab-compare: (\S+) -->\n(.*?)<!-- /headlab-compare: \1 -->"
    for name, body in re.findall(blocks, into.read_text(), re.S):
        if committed.strip() in body:
            return name
    return None


def _pasted(into: Path) -> list[int]:
    """The lines of into that start a table (its Command line) outside every <!-- headlab-compare: NAME --> block."""
    inside, lines = False, []
    for number, line in enumerate(into.read_text().splitlines(), 1):
        if line.startswith(("<!-- headlab-compare: ", "<!-- /headlab-compare: ")):
            inside = line.startswith("<!-- headlab-compare: ")
        elif line.startswith("Command: `headlab-compare ") and not inside:
            lines.append(number)
    return lines


def _shown(path: Path) -> str:
    """A path as a committed command should name it: relative to the working directory where it is below it."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative
