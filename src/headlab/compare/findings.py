"""The findings table of a results file (experiments/RESULTS.md): each claim an experiment states (the `claims` key of
its file in experiments/) read from the table its analysis wrote (results/<block>/compare.csv; a claim pooled over
datasets, compare_meta.csv; a claim on a pruning curve, compare_pruning.csv, its arm a step: heads_pruned=8; a
setting's target across datasets, compare_across.csv; a claim read in rounds, compare_rounds.csv) and from
its confirmation's (results/<block>/confirm), between the lines <!-- headlab-findings --> and
<!-- /headlab-findings -->. Generated, never typed: headlab-compare --into refreshes it with each table, and --check
says whether it is what the tables give."""

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from headlab.compare import blocks
from headlab.compare.tables import AT_BUDGET, legend
from headlab.files import read_received
from headlab.stats.contrasts import CompareError, t_interval, welch
from headlab.stats.power import ALPHA
from headlab.stats.sequential import SIGNIFICANT, WITHIN_MARGIN

START, END = "<!-- headlab-findings -->", "<!-- /headlab-findings -->"
EXPECTED = {"lower": -1, "higher": 1, "same": 0, "not lower": 0, "within": 0}  # the arm against its baseline
# (within: a setting across datasets, its gap to each dataset's best within the table's target)

LEGEND = (
    "Reading: **supported** where the contrast is significant (Holm p < 0.05) in the claimed direction (for a "
    'claimed match: no difference found, the difference\'s 95% interval within the stated margin; for "not worse": '
    "either), **contradicted** where it is significant the other way, else the table's verdict: no difference found, "
    "inconclusive (with a margin, neither), not significant (without one no difference can be shown absent). Δ: "
    "the arm "
    "minus its baseline, each at its own selected learning rate, with the test's 95% interval (tables whose runs "
    "were not kept: Welch's, from their summaries). Seeds 10-19: the same claim read from the confirmation stated "
    "before its runs. A claim stated at several sizes is shown at the largest, where the paper places it. A claim "
    "marked *stated after its runs* was written down after its table was read: it records what the table says, and "
    "is no test of a prediction. A reading *at this budget*: a run of either arm was still improving when training "
    "ended, so it says what these epochs bought, not what the arms reach. A setting across datasets (*across*): Δ "
    "is its largest gap to a dataset's best setting, with that gap's interval, and the reading is the table's "
    "target: **supported** where met on every dataset, else on which it was missed or inconclusive. A claim read in "
    "*rounds* (a sweep that stopped arms as their contrasts were decided, sweep.sequential): Δ and its repeated "
    "interval at the look its arm stopped at, the p of that look beside the look's level (below it: significant), "
    "the level from the file's stated alpha an arm."
)


@dataclass
class Claim:
    """One pre-stated contrast: the arm (KEY=VALUE conditions on the table's rows) against its baseline on a metric,
    in the claimed direction (EXPECTED), read from the block's table."""

    experiment: str
    claim: str
    arm: list[str]
    metric: str
    expect: str
    block: str
    pooled: bool = False  # read from the meta-analysis over datasets (compare_meta.csv)
    after_runs: bool = False  # stated after the runs were read (`stated_after_runs: true`), and shown as such
    pruning: bool = False  # a difference of orders on the pruning curve (compare_pruning.csv)
    across: bool = False  # a setting's gaps to each dataset's best (compare_across.csv)
    rounds: bool = False  # the arm's reading in the sweep's sequential rounds (compare_rounds.csv)

    @property
    def table(self) -> str:
        """The CSV of the block's table that holds this claim's row."""
        kinds = {
            "compare_meta.csv": self.pooled,
            "compare_pruning.csv": self.pruning,
            "compare_across.csv": self.across,
            "compare_rounds.csv": self.rounds,
        }
        return next((name for name, holds in kinds.items() if holds), "compare.csv")


def claims(experiments: Path) -> list[Claim]:
    """Every claim the experiment files of the folder state, in file order; a CompareError naming the file and key
    for a claim without its fields or with another direction than EXPECTED's."""
    found = []
    for path in sorted(experiments.glob("*.yaml")):
        stated = OmegaConf.to_container(OmegaConf.create(path.read_text())).get("claims") or []
        for i, c in enumerate(stated):
            where = f"{path.name}'s claims[{i}]"
            missing = [k for k in ("claim", "arm", "metric", "expect") if k not in c]
            if missing:
                raise CompareError(f"{where} needs {', '.join(missing)}")
            if c["expect"] not in EXPECTED:
                raise CompareError(f"{where}: expect {c['expect']!r} is not one of {', '.join(EXPECTED)}")
            arm = [c["arm"]] if isinstance(c["arm"], str) else list(c["arm"])
            block = c.get("block", path.stem)
            pooled, after = bool(c.get("pooled", False)), bool(c.get("stated_after_runs", False))
            kind = {k: bool(c.get(k, False)) for k in ("pruning", "across", "rounds")}
            if kind["across"] != (c["expect"] == "within"):
                raise CompareError(f"{where}: expect within goes with across: true, and only with it")
            found.append(Claim(path.stem, c["claim"], arm, c["metric"], c["expect"], block, pooled, after, **kind))
    return found


def table(experiments: Path) -> str:
    """The findings block's text: a row per claim, then the legend."""
    lines = [
        "| experiment | claim | arm, metric | Δ [95% CI] | Holm p | reading | seeds 10-19 |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in claims(experiments):
        first = read(c, experiments / "results" / c.block)
        confirm = experiments / "results" / c.block / "confirm"
        again = read(c, confirm) if (confirm / c.table).is_file() else None
        shown = f"[{c.experiment}](results/{c.block}/compare.md)"
        claim = c.claim + (" *(stated after its runs)*" if c.after_runs else "")
        if first is None:  # no table yet to link to
            lines.append(f"| {c.experiment} | {claim} | {_arm(c)} | not run | | | |")
            continue
        if again is None:
            confirmed = "not run" if not (confirm / c.table).is_file() else "not stated"
        else:
            confirmed = reading(c, again)
        interval = "" if math.isnan(first["low"]) else f" [{first['low']:+.3f}, {first['high']:+.3f}]"
        lines.append(
            f"| {shown} | {claim} | {_arm(c)} | {first['effect']:+.3f}{interval} | {_p(first['p_holm'])}"
            f"{_level(first)} | {reading(c, first)}{_budget(first)} | {confirmed}{_budget(again)} |"
        )
    return "\n\n".join(["\n".join(lines), LEGEND, *legend()])


def held(path: Path) -> tuple[str, str] | None:
    """(what the findings block of a results file holds, what the tables and experiment files beside it give
    now); None for a file without the block."""
    text = path.read_text()
    if START not in text or END not in text:
        return None
    return text.split(START, 1)[1].split(END, 1)[0].strip(), table(path.parent)


def refresh(path: Path) -> bool:
    """Rewrite the findings block of a results file from the tables beside it; False where it has none."""
    if held(path) is None:
        return False
    blocks.put(path, START, END, table(path.parent))
    return True


VERDICTS = ("significant", "not significant", "no difference found", "inconclusive", "")  # a table's verdict cells


def read(c: Claim, folder: Path) -> dict | None:
    """{effect, low, high, p_holm, verdict} of the claim in the table of folder; None where the folder has no table
    or no row of the arm (a confirmation that did not state the metric). A table may come from anyone: a cell that
    is not what compare writes is a CompareError naming the file (_checked)."""
    name = c.table
    try:
        found = _read(c, folder, name)
    except (ValueError, KeyError, TypeError) as error:
        raise CompareError(f"{folder / name}: the row of {c.arm} cannot be read ({error})"[:400]) from None
    return None if found is None else _checked(found, c, folder / name)


def _checked(found: dict, c: Claim, where: Path) -> dict:
    """A row as compare writes it: a verdict of VERDICTS, a finite effect, a Holm p-value in [0, 1] (none where no
    test was made), an interval of numbers or none, and a verdict that a test was made for."""
    effect, low, high, p = (found[k] for k in ("effect", "low", "high", "p_holm"))
    wrong = [
        f"verdict {found['verdict']!r}"[:80] if found["verdict"] not in VERDICTS else "",
        f"effect {effect}" if not math.isfinite(effect) else "",
        f"Holm p {p}" if not (0 <= p <= 1 or (math.isnan(p) and found["verdict"] == "")) else "",
        f"interval [{low}, {high}]" if math.isinf(low) or math.isinf(high) or low > high else "",
    ]
    if wrong := [w for w in wrong if w]:
        raise CompareError(f"{where}: the row of {c.arm} is not a table compare writes: {', '.join(wrong)}")
    return found


def _read(c: Claim, folder: Path, name: str) -> dict | None:
    if not (folder / name).is_file():
        return None
    try:
        rows = list(csv.DictReader(io.StringIO(read_received(folder / name), newline="")))
    except (OSError, UnicodeDecodeError) as error:  # a link, a pipe, over a record's size: never read
        raise CompareError(f"{folder / name} cannot be read: {error}") from None
    if c.across:
        return _worst_gap(c, rows)
    if c.rounds:
        return _round(c, rows, folder / name)
    if name != "compare.csv":  # a row a contrast and metric
        arm = [r for r in rows if _holds(r, c.arm) and r["metric"] == c.metric]
        if not arm:
            return None
        r = arm[0]
        return {k: float(r[k]) for k in ("effect", "low", "high", "p_holm")} | {"verdict": r["verdict"]}
    arm = [r for r in rows if _holds(r, c.arm) and r.get(f"{c.metric}_mean")]
    if len(arm) != 1:
        if not arm:
            return None
        raise CompareError(f"{c.experiment}'s claim {c.claim!r}: {len(arm)} rows of {folder}/{name} hold {c.arm}")
    r = {k[len(c.metric) + 1 :]: v for k, v in arm[0].items() if k.startswith(f"{c.metric}_")}
    if r.get("effect_low") is not None:  # tables from the commit that writes the contrast's interval on
        return {
            "effect": float(r["effect"]),
            "low": float(r["effect_low"] or "nan"),
            "high": float(r["effect_high"] or "nan"),
            "p_holm": float(r["p_holm"]),
            "verdict": r["verdict"],
            "budget": r.get("budget") == AT_BUDGET,
        }
    base = _baseline(rows, arm[0], c)  # a table whose runs were not kept: Welch from the two arms' summaries
    effect, se, df = welch(*(float(x[f"{c.metric}_{s}"]) for x in (arm[0], base) for s in ("mean", "std", "n")))
    low, high = t_interval(effect, se, df)
    p_holm = float(r["p_holm"])
    return {"effect": effect, "low": low, "high": high, "p_holm": p_holm, "verdict": _verdict(p_holm)}


def _worst_gap(c: Claim, rows: list[dict]) -> dict | None:
    """A setting's largest gap to a dataset's best on the claim's metric, its interval, and its target per dataset
    (compare_across.csv: a row per setting, metric and dataset)."""
    gaps = [r for r in rows if _holds(r, c.arm) and r["metric"] == c.metric]
    if not gaps:
        return None
    worst = max(gaps, key=lambda r: float(r["gap"]))
    found = {k: float(worst[f"gap{s}"] or "nan") for k, s in (("effect", ""), ("low", "_low"), ("high", "_high"))}
    over = list(rows[0])[list(rows[0]).index("metric") + 1]  # the key the settings are read across: data
    return found | {"p_holm": math.nan, "verdict": "", "targets": {r[over]: r["target"] for r in gaps}}


ROUND_VERDICTS = {SIGNIFICANT: "significant", WITHIN_MARGIN: "no difference found"}  # a round's reading, as a verdict


def _round(c: Claim, rows: list[dict], where: Path) -> dict | None:
    """The arm's round (compare_rounds.csv): its difference and repeated interval at the look it stopped at, that
    look's p, and the reading as a table's verdict (undecided at the last look: inconclusive with a margin, else not
    significant)."""
    arm = [r for r in rows if _holds(r, c.arm) and r["metric"] == c.metric and r["look"]]
    if len(arm) > 1:
        raise CompareError(f"{c.experiment}'s claim {c.claim!r}: {len(arm)} rows of {where} hold {c.arm}")
    if not arm:
        return None
    r = arm[0]
    undecided = "inconclusive" if r["margin"] else "not significant"
    verdict = ROUND_VERDICTS.get(r["reading"], undecided if not r["reading"] else r["reading"])
    found = {k: float(r[k]) for k in ("effect", "low", "high")}
    return found | {"p_holm": float(r["p"]), "level": float(r["level"]), "verdict": verdict}


def reading(c: Claim, found: dict) -> str:
    """What the contrast says of the claim (LEGEND)."""
    if c.across:
        targets = found["targets"]
        if all(t == "met" for t in targets.values()):
            return "**supported**"
        said = [
            f"{t} on {', '.join(sorted(d for d, x in targets.items() if x == t))}" for t in ("missed", "inconclusive")
        ]
        return "target " + "; ".join(x for x in said if not x.endswith(" on "))
    direction = math.copysign(1, found["effect"])
    if found["verdict"] == "significant":
        wanted = EXPECTED[c.expect]
        if wanted == direction or (c.expect == "not lower" and direction > 0):
            return "**supported**"
        return "**contradicted**"
    if found["verdict"] == "no difference found" and c.expect in ("same", "not lower"):
        return "**supported**"
    return found["verdict"] or "not tested"


def _baseline(rows: list[dict], arm: dict, c: Claim) -> dict:
    """The row an arm of an older table was compared with: the one without a p-value that shares the arm's
    values of every key the claim does not name."""
    named = {condition.partition("=")[0] for condition in c.arm}
    columns = list(rows[0])
    keys = [k for k in columns[: columns.index("runs")] if k not in named and k != "optim.lr"]  # compare.csv's keys
    for r in rows:
        if r.get(f"{c.metric}_p_value") in ("", "nan") and all(r[k] == arm[k] for k in keys):
            return r
    raise CompareError(f"{c.experiment}'s claim {c.claim!r}: no baseline row beside {c.arm}")


def _verdict(p_holm: float) -> str:
    return "significant" if p_holm < ALPHA else "not significant"


def _holds(row: dict, conditions: list[str]) -> bool:
    """Whether a CSV row has each KEY=VALUE: null for an empty cell, numbers by value, text in any case."""
    return all(key in row and _same(row[key], value) for key, _, value in (c.partition("=") for c in conditions))


def _same(cell: str, value: str) -> bool:
    if value in ("null", "None") or cell == "":
        return value in ("null", "None") and cell == ""
    try:
        return float(cell) == float(value)
    except ValueError:
        return cell.lower() == value.lower()


def _budget(found: dict | None) -> str:
    """' at this budget' where a run of either arm was still improving when training ended (compare.csv's budget)."""
    return f" {AT_BUDGET}" if found and found.get("budget") else ""


def _arm(c: Claim) -> str:
    """The arm's conditions by the last part of each key (model.attention.n_heads=1 -> n_heads=1; a value's own
    dots stay: optim.rdrop=3.0 -> rdrop=3.0)."""
    shown = ", ".join(
        f"{key.rsplit('.', 1)[-1]}={value}" for key, value in (condition.split("=", 1) for condition in c.arm)
    )
    return f"{shown}{' (pooled)' if c.pooled else ' (across)' if c.across else ''}; {c.metric}"


def _p(p: float) -> str:
    return "" if math.isnan(p) else f"{p:.2g}"


def _level(found: dict) -> str:
    """' (level 0.0014)' beside a round's p: the look's level it was read at (rounds only)."""
    return f" (level {found['level']:.2g})" if found.get("level") is not None else ""
