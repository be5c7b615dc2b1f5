"""headlab-compare --check [PATH...]: recompute every committed table from the run archive kept beside it.

A table's compare.json records its analysis and sources (a table made before compare.json: its compare.md's Command
line). --check replays it through headlab.compare.report on the runs' archive (the table's own --archive, or, for a
table read from the same directories as an archived one, that archive) into a temporary folder and compares the
table rows (every line of compare.md that starts with "|": numbers, intervals, tests and verdicts) with the
committed ones; where the table was put into a file (--into), it also checks that the file's block still holds
compare.md, and that the file holds no table outside such blocks (a pasted copy would go stale unseen). Nothing is
written beside the tables. Exit 1 when a table differs or cannot be replayed; tables whose runs were never archived
are listed and do not fail the check.

--update rewrites each table that differs from its archive instead (compare.md, compare.csv, compare.json and the
plots in its folder, and its block of the --into file, which must lie below the working directory), recording the
archive as the table's source, and writes compare.json beside a table that agrees and has none: after a change to
the analysis, `headlab-compare --check --update` and `git diff` show what it changed in every published table.
"""

import difflib
import json
import os
import shlex
import tempfile
from collections.abc import Callable
from pathlib import Path

from headlab.compare import analysis, blocks, findings
from headlab.compare.report import RECORD, report
from headlab.files import write_json_atomic
from headlab.stats import archive
from headlab.stats.contrasts import CompareError
from headlab.stats.runs import load_dirs

ELSEWHERE = ("--out", "--into", "--block", "--archive", "--wandb", "--group")  # a command's flags beside the analysis
PLAIN = ("--no-plots", "--confirm")  # flags without a value beside the analysis's


def recorded(table: Path) -> tuple[list[str], dict, dict] | None:
    """(sources, the analysis's options, {into, block, archive, wandb, group}) a table was made from: its
    compare.json, else its compare.md's Command line; None without either."""
    if (table.parent / RECORD).is_file():
        record = json.loads((table.parent / RECORD).read_text())
        sources = dict(record["sources"])
        return list(map(str, sources.pop("dirs", None) or [])), record["analysis"], sources
    for line in table.read_text().splitlines():
        if line.startswith("Command: `headlab-compare ") and line.endswith("`"):
            return split(shlex.split(line[len("Command: `headlab-compare ") : -1]))
    return None


def split(argv: list[str]) -> tuple[list[str], list[str], dict[str, str]]:
    """(sources, analysis flags, {into, block, archive, wandb, group: its value}) of a recorded command."""
    plain = {flag for flag in analysis.FLAGS if analysis.takes_no_value(flag)} | set(PLAIN)
    sources, flags, elsewhere = [], [], {}
    words = iter(argv)
    for word in words:
        flag, eq, value = word.partition("=")
        if not word.startswith("--"):
            sources.append(word)
        elif flag in ELSEWHERE:
            elsewhere[flag[2:]] = value if eq else next(words, "")
        elif flag not in PLAIN:
            flags += [word] if eq or flag in plain else [word, next(words, "")]
    return sources, flags, elsewhere


def resolve(path: str, table: Path) -> Path | None:
    """A path of a recorded command, relative to where it was run: the working directory or a folder above the
    table (the repository's root, for experiments/results/...)."""
    for base in [Path.cwd(), *table.resolve().parents]:
        if (base / path).exists():
            return base / path
    return None


def check(paths: list[Path], update: bool = False, say: Callable[[str], None] = print) -> int:
    """Replay every compare.md below the paths; say one line per table; 0 when all archived tables agree (or,
    with update, were rewritten from their archives)."""
    tables = sorted({t for p in paths for t in ([p] if p.is_file() else p.rglob("compare.md"))})
    if not tables:
        say(f"headlab-compare --check: no compare.md below {', '.join(map(str, paths))}")
        return 1
    made = {t: recorded(t) for t in tables}
    archived = {}  # the sources of each archiving table -> their archive
    for table, (sources, _, elsewhere) in ((t, r) for t, r in made.items() if r):
        if "archive" in elsewhere and (found := resolve(elsewhere["archive"], table)):
            archived[tuple(sources)] = found
    failed = 0
    for table, parts in made.items():
        verdict, detail = _check(table, parts, archived, update)
        failed += verdict in ("differs", "failed")
        say(f"{verdict}: {table}" + (f" ({detail})" if detail else ""))
    intos = {(parts[2].get("into"), table) for table, parts in made.items() if parts}
    for file in sorted({found for into, table in intos if into and (found := resolve(into, table))}):
        failed += _check_findings(file, update, say)
        for line in blocks.pasted(file):
            failed += 1
            say(
                f"differs: {_shown(file)}:{line} (a table pasted outside a headlab-compare block, which --check "
                f"cannot keep true: write it with --into {_shown(file)} --block NAME)"
            )
    return 1 if failed else 0


def _check_findings(file: Path, update: bool, say: Callable[[str], None]) -> int:
    """1 where the findings table of a results file is not what its tables give (with update: rewritten), else 0."""
    try:
        both = findings.held(file)
    except CompareError as error:
        say(f"failed: {_shown(file)}'s findings table ({error})")
        return 1
    if both is None:
        return 0
    if both[0] == both[1]:
        say(f"same: {_shown(file)}'s findings table")
        return 0
    if update:
        findings.refresh(file)
        say(f"updated: {_shown(file)}'s findings table")
        return 0
    said = "\n".join(
        list(difflib.unified_diff(*(x.splitlines() for x in both), "committed", "recomputed", lineterm=""))[2:14]
    )
    say(f"differs: {_shown(file)}'s findings table\n{said}")
    return 1


def _check(table: Path, parts: tuple | None, archived: dict, update: bool) -> tuple[str, str]:
    """One table against its archive: (same | differs | failed | not archived | updated, what was found)."""
    if parts is None:
        return "failed", "no Command line"
    sources, stated, elsewhere = parts
    if "wandb" in elsewhere:
        return "not archived", "read from W&B"
    if tuple(sources) in archived:
        inputs = [archived[tuple(sources)]]
    elif sources and all(s.endswith(archive.SUFFIXES) and resolve(s, table) for s in sources):
        inputs = [resolve(s, table) for s in sources]
    else:
        return "not archived", "its runs were not kept"
    try:
        repeated = {_shown(i): n for i in inputs if i.is_file() and (n := len(archive.duplicates(i)))}
    except archive.UNREADABLE as error:
        return "failed", f"not a readable archive: {error}"
    if repeated and update:
        for source in repeated:
            archive.rebuild(Path(source))
    elif repeated:  # tar -x would keep one of each: a sweep continued from it would lose runs
        where = ", ".join(f"{s} ({n} members twice)" for s, n in repeated.items())
        return "differs", f"{where}: each copy needs a root of its own (--check --update rebuilds it)"
    into = resolve(elsewhere["into"], table) if "into" in elsewhere else None
    committed = table.read_text()
    try:
        values = analysis.options(stated, f"{table}'s analysis")
        again, numbers = _replay(inputs, values, None)
    except CompareError as error:
        return "failed", str(error)
    written = (table.parent / "compare.csv").read_text() if (table.parent / "compare.csv").is_file() else ""
    in_block = into is None or blocks.brief(committed, into, table.parent) in into.read_text()
    if _rows(again) == _rows(committed) and numbers == written and in_block:
        rebuilt = f"; rebuilt {', '.join(repeated)} with a root for each copy" if repeated else ""
        if update and not (table.parent / RECORD).is_file():
            _record(table.parent, sources, values, elsewhere)
            rebuilt += f"; wrote its {RECORD}"
        return "same", f"{len(_rows(committed))} table lines from {', '.join(map(_shown, inputs))}{rebuilt}"
    if not update:
        if _rows(again) != _rows(committed):
            return "differs", "\n" + _diff(_rows(committed), _rows(again))
        if numbers != written:
            return "differs", "its compare.csv is not the one its runs give (--check --update rewrites it)"
        return "differs", f"{elsewhere['into']} no longer holds this table"
    if into and not into.resolve().is_relative_to(Path.cwd().resolve()):
        return "failed", f"--into {elsewhere['into']} lies outside the working directory: not written"
    block = blocks.holding(into, committed, table.parent) if into else None
    if into and block is None:
        return "failed", f"no block of {elsewhere['into']} holds this table: put it back first"
    kept = {k: elsewhere[k] for k in ("into", "block") if k in elsewhere} if block else {}
    again, _ = _replay(inputs, values, table.parent, {**kept, "block": block} if block else {})
    if block:
        blocks.splice(into, block, again, table.parent)
    return "updated", f"from {', '.join(map(_shown, inputs))}" + (
        f" and its block {block} of {_shown(into)}" if block else ""
    )


def _replay(inputs: list[Path], values: dict, out: Path | None, into: dict | None = None) -> tuple[str, str]:
    """The table the runs of inputs give under the analysis: its compare.md and compare.csv, written into out with
    its figures (the archive recorded as its source, and the block it fills), or, tables only, into a temporary
    folder."""
    sources = {"dirs": [_shown(i) for i in inputs], **(into or {})}
    said = ["headlab-compare", *sources["dirs"], *analysis.to_flags(values), "--out", _shown(out)] if out else None
    with tempfile.TemporaryDirectory() as temporary:
        report(load_dirs(inputs), analysis.analysis(values), out or Path(temporary), sources, said, plots=bool(out))
        folder = out or Path(temporary)
        return (folder / "compare.md").read_text(), (folder / "compare.csv").read_text()


def _record(folder: Path, sources: list[str], values: dict, elsewhere: dict) -> None:
    """compare.json for a table that agrees with its archive and was made before tables kept one."""
    kept = {k: v for k, v in elsewhere.items() if k != "out"}  # where the runs were read and the table put
    record = {"sources": {"dirs": sources, **kept}, "analysis": analysis.stated(values)}
    write_json_atomic(folder / RECORD, record)


def _rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


def _diff(committed: list[str], again: list[str]) -> str:
    """The first three rows that changed, committed and recomputed, or the whole unified diff of the rows."""
    if len(committed) != len(again):
        return "\n".join(list(difflib.unified_diff(committed, again, "committed", "recomputed", lineterm=""))[2:14])
    changed = [(a, b) for a, b in zip(committed, again, strict=True) if a != b]
    more = f"\n(and {len(changed) - 3} rows more)" if len(changed) > 3 else ""
    return "\n".join(f"- {a}\n+ {b}" for a, b in changed[:3]) + more


def _shown(path: Path) -> str:
    """A path as a committed command should name it: relative to the working directory where it is below it."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative
