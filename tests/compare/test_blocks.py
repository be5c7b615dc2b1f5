"""A table as a block of experiments/RESULTS.md shows it: in brief, compare.md beside it keeping the rest."""

from pathlib import Path

from headlab.compare import blocks

SHA = "0123456789abcdef0123456789abcdef01234567"
HEADER = [
    "design",
    "model.attention.gate",
    "model.attention.n_heads",
    "optim.lr (selected on val/acc_best)",
    "runs",
    "test/acc (mean [95% bootstrap CI])",
    "val/acc_best (mean [95% bootstrap CI])",
    "improving at end (last val/acc best by > 0.005)",
    "params",
    "train tokens/s",
]
ROWS = [
    [
        "gate\\|x",
        "headwise",
        "4",
        "0.03 (edge of its grid 0.001..0.03: not bracketed)",
        "10",
        "0.9000 [0.8000, 0.9500] (sd 0.0500) Δ -0.1000 p=0.001 (Holm 0.002) significant (power 0.90 at ±0.02; 80% "
        "needs 4 seeds an arm)",
        "0.91 [0.8, 0.95] (sd 0.05)",
        "1/10 improving: not converged",
        "60115",
        "2,295",
    ],
    [
        "plain",
        "none",
        "4",
        "0.003",
        "10",
        "1.0000 [1.0000, 1.0000] (sd 0.0000) (baseline)",
        "1.0 [1.0, 1.0] (sd 0.0) (baseline)",
        "0/10 improving: converged",
        "60115",
        "1,803",
    ],  # fmt: skip
]
TABLE = "\n".join(
    [
        "Command: `headlab-compare runs --select optim.lr --baseline design=plain --effect 0.02 --out results/x`",
        f"headlab commit (compare): {SHA}",
        f"Runs' commits: {SHA} (20 runs)",
        "Runs' hardware: cpu x1, 2 threads (20 runs)",
        "Intervals: 95% percentile bootstrap of the mean over seeds (10,000 resamples); p: Welch's t-test.",
        "Verdicts: significant (Holm p < 0.05); no difference found (...).",
        "Speed: these runs trained in packs of 10 (20 runs).",
        "",
        "Keys that follow data (one value per dataset; compare.csv has them as columns):",
        "- cr: data.files.train=$HEADLAB_DATA/cr/custrev.all",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
        *("| " + " | ".join(row) + " |" for row in ROWS),
        "",
        "Pooled over the values of data (a random-effects meta-analysis of k values: how it is made): the rest.",
        "",
        "| arm | metric | k | pooled Δ [95% CI] |",
        "|---|---|---|---|",
        "| design=gate\\|x, model.attention.gate=headwise, model.attention.n_heads=4 | test/acc | 2 "
        "| -0.1 [-0.2, 0.0] |",
    ]
)


def test_a_block_keeps_the_command_findings_and_verdicts_and_links_compare_md_for_the_rest(tmp_path):
    into = tmp_path / "experiments" / "RESULTS.md"
    shown = blocks.brief(TABLE, into, tmp_path / "experiments" / "results" / "x")
    assert shown.splitlines() == [
        TABLE.splitlines()[0],
        "Made by headlab 0123456789ab from runs at 0123456789ab (20 runs), on cpu x1, 2 threads (20 runs); every "
        "column, interval and test: [results/x/compare.md](results/x/compare.md)",
        "",
        # the costs' columns, val/acc_best beside test/acc, and the keys a design sets are compare.md's alone;
        # so are standard deviations, unadjusted p-values and power; a verdict and its Holm p stay
        "| design | optim.lr (selected on val/acc_best) | runs | test/acc (mean [95% bootstrap CI]) | "
        "improving at end (last val/acc best by > 0.005) |",
        "|---|---|---|---|---|",
        "| gate\\|x | 0.03 (grid's edge) | 10 | 0.9000 [0.8000, 0.9500] Δ -0.1000 (Holm 0.002) significant | 1/10 |",
        "| plain | 0.003 | 10 | 1.0000 [1.0000, 1.0000] (baseline) | 0/10 |",
        "",
        "Pooled over the values of data (random effects; compare.md states how):",
        "",
        "| arm | metric | k | pooled Δ [95% CI] |",
        "|---|---|---|---|",
        "| design=gate\\|x | test/acc | 2 | -0.1 [-0.2, 0.0] |",
    ]


def test_a_key_that_varies_within_a_named_choice_stays(tmp_path):
    table = "\n".join(
        [
            "Command: `headlab-compare runs`",
            "",
            "| model.attention.d_k | scoring | model.attention.scale | runs | test/acc (mean) |",
            "|---|---|---|---|---|",
            *(f"| {d} | {s} | {s == 'dot'} | 10 | 0.9 |" for d in (8, 64) for s in ("dot", "additive")),
        ]
    )
    header = blocks.brief(table, tmp_path / "RESULTS.md", tmp_path).splitlines()[2]
    assert header == "| model.attention.d_k | scoring | runs | test/acc (mean) |"


def test_settings_across_datasets_stand_for_every_arm_on_every_dataset(tmp_path):
    table = "\n".join(
        [
            "Command: `headlab-compare runs --across data`",
            "",
            "| data | optim.lr | runs | test/acc (mean over folds [95% corrected t CI]) |",
            "|---|---|---|---|",
            "| cr | 0.01 | 3 | 0.8 [0.7, 0.9] |",
            "",
            "Settings across the values of data (k = 2): each setting's mean per data value: how it is read.",
            "",
            "| setting (test/acc) | worst gap | cr | mr |",
            "|---|---|---|---|",
            "| optim.lr=0.01 **(chosen)** | 0.01 | 0.8 [0.7, 0.9] (gap 0.0000) | 0.7 [0.6, 0.8] (gap 0.0100 [-0.02, "
            "+0.04]) |",
        ]
    )
    assert blocks.brief(table, Path("RESULTS.md"), Path("results/x")).splitlines()[1:7] == [
        "",
        "Settings across the values of data (k = 2) (compare.md states how they are read):",
        "",
        "| setting (test/acc) | worst gap | cr | mr |",
        "|---|---|---|---|",
        "| optim.lr=0.01 **(chosen)** | 0.01 | 0.8 (gap 0.0000) | 0.7 (gap 0.0100) |",
    ]


def test_a_table_whose_rows_do_not_match_its_header_is_shown_as_it_is(tmp_path):
    table = "Command: `headlab-compare runs`\n\n| a | params |\n|---|---|\n| 1 | 2 | 3 |\n"
    assert "| 1 | 2 | 3 |" in blocks.brief(table, tmp_path / "RESULTS.md", tmp_path)
