"""The figures README.md and docs/data.md state of the text defaults are the ones the archived search's tables give
(experiments/results/text_defaults_search/stage3: compare.csv, compare_across.csv, which --check recomputes)."""

import csv
import re
from pathlib import Path

from conftest import ROOT

STAGE3 = ROOT / "experiments" / "results" / "text_defaults_search" / "stage3"
DEFAULTS = {"auto_epochs.scale": "1", "model.dropout": "0.3", "optim.lr": "0.003"}
NAMES = {"SST-2 (SentEval test)": "files", "CR": "cr", "MPQA": "mpqa", "MR": "mr", "SUBJ": "subj", "SST-5": "sst5"}


def _defaults_gaps() -> dict[str, dict]:
    """Each dataset's row of the defaults' test accuracy and gap to its best, as compare_across.csv has them."""
    with (STAGE3 / "compare_across.csv").open(newline="") as f:
        rows = [
            r for r in csv.DictReader(f) if r["metric"] == "test/acc" and all(r[k] == v for k, v in DEFAULTS.items())
        ]
    return {r["data"]: r for r in rows}


def test_the_text_defaults_table_of_docs_data_md_is_the_archived_searchs():
    gaps = _defaults_gaps()
    rows = [line for line in (ROOT / "docs" / "data.md").read_text().splitlines() if line.startswith("| ")]
    seen = set()
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] not in NAMES:
            continue
        r = gaps[NAMES[cells[0]]]
        seen.add(cells[0])
        mean, low, high = (float(x) for x in re.findall(r"\d\.\d+", cells[1]))
        assert (mean, low, high) == (round(float(r["mean"]), 3), round(float(r["low"]), 3), round(float(r["high"]), 3))
        if r["gap"] == "0.0":
            assert cells[5].startswith("0: met")
            continue
        assert float(cells[4]) == round(float(r["mean"]) + float(r["gap"]), 3)  # the best's test accuracy
        gap, gap_low, gap_high = (float(x) for x in re.findall(r"[+-]\d\.\d+", cells[5]))
        assert gap == round(float(r["gap"]), 3) and cells[5].endswith(r["target"])
        assert (gap_low, gap_high) == (round(float(r["gap_low"]), 3), round(float(r["gap_high"]), 3))
    assert seen == set(NAMES)


def test_the_readmes_text_figures_are_the_archived_searchs():
    gaps = _defaults_gaps()
    readme = " ".join((ROOT / "README.md").read_text().split())
    said = dict(re.findall(r"(CR|MPQA|MR|SUBJ|SST-5|SST-2) (0\.\d{3})", readme.split("test accuracy CR")[1][:80]))
    said["CR"] = readme.split("test accuracy CR ")[1][:5]
    assert {name: float(v) for name, v in said.items()} == {
        name: round(float(gaps[key]["mean"]), 3)
        for name, key in (
            ("CR", "cr"),
            ("MPQA", "mpqa"),
            ("MR", "mr"),
            ("SUBJ", "subj"),
            ("SST-5", "sst5"),
            ("SST-2", "files"),
        )
    }


def test_the_held_out_readings_of_readme_and_docs_data_md_are_the_archived_confirmations():
    """text_defaults_unseen's figures as its compare.csv (each set's difference and interval) and compare_meta.csv
    (pooled) give them, and the rule stated before its runs applied to them: the defaults stay unless the pooled
    difference is significant above 0."""
    unseen = ROOT / "experiments" / "results" / "text_defaults_unseen"
    with (unseen / "compare.csv").open(newline="") as f:
        rows = {Path(r["data.files.train"]).stem: r for r in csv.DictReader(f) if r["auto_epochs.scale"] == "2"}
    with (unseen / "compare_meta.csv").open(newline="") as f:
        (pooled,) = list(csv.DictReader(f))
    number = lambda x: f"{float(x):+.3f}"  # noqa: E731
    docs = " ".join((ROOT / "docs" / "data.md").read_text().split())
    for name, key in (("Amazon", "amazon"), ("IMDb", "imdb"), ("Yelp", "yelp")):
        r = rows[key]
        effect, low, high = (number(r[f"test/acc_{k}"]) for k in ("effect", "effect_low", "effect_high"))
        assert f"{effect} [{low}, {high}] on {name}" in docs
    assert f"{number(pooled['effect'])} [{number(pooled['low'])}, {number(pooled['high'])}] pooled" in docs
    stays = not (float(pooled["p_holm"]) < 0.05 and float(pooled["effect"]) > 0)
    assert stays and "so by the stated rule the defaults stay" in docs
    readme = " ".join((ROOT / "README.md").read_text().split())
    effects = sorted(float(r["test/acc_effect"]) for r in rows.values())
    assert f"{effects[0]:+.3f} to {effects[-1]:+.3f} on three no search saw, not significantly pooled" in readme


def test_the_speed_docs_quote_no_measurement_of_their_own():
    """Speeds, step times and ratios live in BENCHMARKS.md, which `make bench` rewrites with the machine that measured
    them; a figure typed into the docs would go stale unseen."""
    measured = re.compile(r"\d[\d,.]*\s?(?:tokens/s|ms)\b|\d(?:\.\d+)?x\b")
    for doc in (
        "README.md",
        "docs/speed.md",
        "docs/sweeps.md",
        "docs/statistics.md",
        "docs/data.md",
        "docs/runs.md",
        "docs/heads.md",
        "docs/plan.md",
    ):
        assert measured.findall((ROOT / doc).read_text()) == [], doc
