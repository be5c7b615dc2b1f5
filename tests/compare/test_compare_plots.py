"""headlab-compare over several datasets as a person sees it: figures of a panel per dataset with series named by
what varies within it, and tables without columns for the keys that only follow the dataset."""

import json
import sys

import pytest

from headlab.cli.compare import main
from headlab.compare.figures import curves_figure, grid, legend_below, legend_layout, metric_figure
from headlab.stats.comparison import compare
from headlab.stats.contrasts import Design
from headlab.stats.runs import load_dirs

HEADS = "model.attention.n_heads"
CHANCE = {"cr": 0.64, "subj": 0.5}


def write(root, i, config, acc, chance):
    run = root / str(i)
    run.mkdir(parents=True)
    curve = [{"epoch": e, "step": 10 * (e + 1), "val/acc": acc - 0.1 / (e + 1)} for e in range(3)]
    record = {"status": "completed", "config": config, "metrics": {"test/acc": acc, "val/acc_best": acc}}
    (run / "results.json").write_text(json.dumps({**record, "curve": curve, "data": {"chance": chance}}))


@pytest.fixture
def search(tmp_path):
    """Two datasets, each with its own file (a key that follows the dataset), h in {1, 4}, dropout 0.1 and 0.3,
    2 seeds; cr's h = 4 chose lr 0.01, every other arm lr 0.003."""
    root, i = tmp_path / "runs", 0
    for name in ("cr", "subj"):
        for h in (1, 4):
            for dropout in (0.1, 0.3):
                for seed in range(2):
                    lr = 0.01 if (name, h) == ("cr", 4) else 0.003
                    config = {"data": name, "data.files.train": f"/data/{name}.all", HEADS: h, "model.dropout": dropout}
                    config |= {"optim.lr": lr, "seed": seed}
                    acc = CHANCE[name] + 0.1 + 0.02 * h + 0.01 * seed - dropout / 10
                    write(root, i, config, acc, CHANCE[name])
                    i += 1
    return root


def rows_of(root, design):
    return compare(load_dirs([root]).completed, design)


def test_each_dataset_is_its_own_panel_with_its_chance_and_the_keys_that_follow_it_are_not_series(search):
    design = Design(metrics=["test/acc"], across="data")
    keys, rows = rows_of(search, design)
    assert "data.files.train" in keys  # it varies over the runs, but only with the dataset
    fig = metric_figure(keys, rows, "test/acc", design)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == ["data=cr", "data=subj"]
    assert {ax.get_xlabel() for ax in axes} == {HEADS}  # the numeric key of most values... ties: the first
    (legend,) = fig.legends  # the same names in both panels, without the file that follows the dataset
    series = [f"dropout={d}, lr={lr}" for d in (0.1, 0.3) for lr in (0.003, 0.01)]
    assert sorted(t.get_text() for t in legend.get_texts()) == series
    for ax, name in zip(axes, ("cr", "subj"), strict=True):
        (chance,) = [t.get_text() for t in ax.get_legend().get_texts()]  # the panel names its own chance line
        assert chance == f"chance ({CHANCE[name]:.3g})"
    subj = {c.get_label(): list(c.lines[0].get_ydata()) for c in axes[1].containers}  # lr 0.003 throughout
    for d in (0.1, 0.3):  # h = 1 and 4, the mean over both seeds
        expected = [CHANCE["subj"] + 0.1 + 0.02 * h + 0.005 - d / 10 for h in (1, 4)]
        assert subj[f"dropout={d}, lr=0.003"] == pytest.approx(expected)
    colours = [{c.get_label(): c.lines[0].get_color() for c in ax.containers} for ax in axes]
    first, other = series[0], series[2]
    assert colours[0][first] == colours[1][first] != colours[1][other]  # one series, one colour in every panel


def test_a_key_chosen_per_arm_is_written_at_each_point_not_a_series_of_its_own(search):
    design = Design(metrics=["test/acc"], meta="data", select=("optim.lr", "val/acc_best"))
    keys, rows = rows_of(search, design)
    fig = metric_figure(keys, rows, "test/acc", design)
    cr = fig.axes[0]
    assert sorted(t.get_text() for t in cr.texts) == ["lr=0.003", "lr=0.003", "lr=0.01", "lr=0.01"]
    assert sorted(t.get_text() for t in fig.legends[0].get_texts()) == ["dropout=0.1", "dropout=0.3"]
    unselected = metric_figure(keys, rows, "test/acc", Design(metrics=["test/acc"], meta="data"))  # lr splits cr
    assert "dropout=0.1, lr=0.01" in [t.get_text() for t in unselected.legends[0].get_texts()]


def test_curves_are_drawn_per_dataset_and_the_cli_writes_the_panelled_figures(search, tmp_path):
    design = Design(metrics=["test/acc"], across="data")
    keys, rows = rows_of(search, design)
    fig = curves_figure(keys, rows, design)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == ["data=cr", "data=subj"]
    labels = sorted(t.get_text() for t in fig.legends[0].get_texts())
    assert labels[0] == "n_heads=1, dropout=0.1, lr=0.003" and "n_heads=4, dropout=0.1, lr=0.01" in labels
    main([str(search), "--across", "data", "--metric", "val/acc_best", "--out", str(tmp_path / "out")])
    for name in ("compare_val_acc_best.png", "compare_curves.png"):
        assert (tmp_path / "out" / name).read_bytes()[:4] == b"\x89PNG"


def test_the_tables_list_the_keys_that_follow_the_dataset_once_not_as_columns(search, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)  # a terminal (capsys's stdout is none) without
    monkeypatch.setenv("TERM", "dumb")  # colours
    main([str(search), "--across", "data", "--metric", "val/acc_best", "--no-plots"])
    shown = capsys.readouterr().out
    title = shown[shown.index("runs, grouped by") :].split("\n")[0]
    assert "grouped by data, model.attention.n_heads, model.dropout, optim.lr" in title
    assert "/data/cr.all" not in shown and "┃ n_heads" in shown
    record = (search / "compare.md").read_text()
    (header,) = [line for line in record.splitlines() if line.startswith("| data |")]
    assert "data.files.train" not in header and "model.dropout" in header
    assert "Keys that follow data" in record  # the file read stays in the record, a line per dataset
    assert "- cr: data.files.train=/data/cr.all\n" in record and "- subj: data.files.train=/data/subj.all\n" in record
    assert "data.files.train" in (search / "compare.csv").read_text().splitlines()[0]


def test_keys_that_follow_the_dataset_name_a_released_file_from_headlab_data(tmp_path, monkeypatch):
    """Runs that read $HEADLAB_DATA/cr/cr.all on this machine: compare.md names the file as every machine does."""
    monkeypatch.setenv("HEADLAB_DATA", str(tmp_path / "released"))
    i = 0
    for name in ("cr", "subj"):
        for h in (1, 4):
            for seed in range(2):
                path = str(tmp_path / "released" / name / f"{name}.all")
                config = {"data": name, "data.files.train": path, HEADS: h, "seed": seed}
                write(tmp_path / "runs", i, config, CHANCE[name] + 0.1 * h + 0.01 * seed, CHANCE[name])
                i += 1
    main([str(tmp_path / "runs"), "--across", "data", "--metric", "test/acc", "--no-plots"])
    record = (tmp_path / "runs" / "compare.md").read_text()
    assert "- cr: data.files.train=$HEADLAB_DATA/cr/cr.all\n" in record and str(tmp_path / "released") not in record


def test_cross_validated_arms_draw_chance_as_the_mean_of_their_folds_majority_rates(tmp_path):
    """Each fold has its own test split and majority rate: the chance line of an arm's mean is their mean."""
    folds = [0.62, 0.64, 0.66]  # three folds' majority rates
    for i, (h, fold) in enumerate((h, f) for h in (1, 4) for f in range(3)):
        config = {HEADS: h, "data.cv.fold": fold, "seed": 0}
        write(tmp_path / "runs", i, config, 0.7 + 0.01 * h, folds[fold])
    keys, rows = rows_of(tmp_path / "runs", Design(metrics=["test/acc"]))
    assert [r["chance"] for r in rows] == [pytest.approx(0.64)] * 2 and all(r["chance_varies"] for r in rows)
    ax = metric_figure(keys, rows, "test/acc", Design(metrics=["test/acc"])).axes[0]
    (line,) = [line for line in ax.get_lines() if "chance" in line.get_label()]
    assert line.get_label() == "chance (0.64, mean over runs)" and list(line.get_ydata()) == [pytest.approx(0.64)] * 2


def test_arms_that_differ_by_names_only_are_drawn_each_at_its_place_with_every_seed(tmp_path):
    """Only a key of names varies (a head design): compare_test_acc.png is drawn, one place per arm, its mean and
    interval from compare's table and every seed's value a dot (it was skipped without a word)."""
    accs = {"softmax": [0.70, 0.72, 0.74], "sigmoid": [0.60, 0.61, 0.65]}
    i = 0
    for design, values in accs.items():
        for seed, acc in enumerate(values):
            write(tmp_path / "runs", i, {"model.attention.normalizer": design, "seed": seed}, acc, 0.5)
            i += 1
    keys, rows = rows_of(tmp_path / "runs", Design(metrics=["test/acc"]))
    (ax,) = metric_figure(keys, rows, "test/acc", Design(metrics=["test/acc"])).axes
    names = [t.get_text() for t in ax.get_xticklabels()]
    assert sorted(names) == ["normalizer=sigmoid", "normalizer=softmax"]
    from matplotlib.collections import PathCollection

    dots = sorted(float(y) for c in ax.collections if isinstance(c, PathCollection) for _, y in c.get_offsets())
    assert dots == sorted(v for values in accs.values() for v in values)
    main([str(tmp_path / "runs"), "--metric", "test/acc", "--out", str(tmp_path / "out")])
    assert (tmp_path / "out" / "compare_test_acc.png").read_bytes()[:4] == b"\x89PNG"


def test_a_cross_validated_table_says_its_intervals_are_the_corrected_t_over_folds(tmp_path):
    for i, (h, fold) in enumerate((h, f) for h in (1, 4) for f in range(3)):
        write(tmp_path / "runs", i, {HEADS: h, "data.cv.fold": fold, "seed": 0}, 0.7 + 0.01 * h + 0.01 * fold, 0.5)
    main([str(tmp_path / "runs"), "--metric", "test/acc", "--baseline", f"{HEADS}=4", "--no-plots"])
    (intervals,) = [
        line for line in (tmp_path / "runs" / "compare.md").read_text().splitlines() if "Intervals:" in line
    ]
    assert "Student's t over folds with the corrected variance" in intervals and "bootstrap" not in intervals
    assert "p: the corrected paired t over folds," in intervals


def test_an_accuracys_interval_over_few_folds_is_clipped_to_what_an_accuracy_can_be(tmp_path):
    """Three folds at 0.98, 0.70, 1.00: the corrected t interval reaches above 1; the table's stops at 1.0000."""
    for fold, acc in enumerate([0.98, 0.70, 1.00]):
        write(tmp_path / "runs", fold, {HEADS: 1, "data.cv.fold": fold, "data.cv.folds": 3, "seed": 0}, acc, 0.5)
    keys, rows = rows_of(tmp_path / "runs", Design(metrics=["test/acc"]))
    assert rows[0]["test/acc"]["high"] == 1.0 and rows[0]["test/acc"]["low"] < 0.7


LONG_NAMES = {
    "sst2_scoring's": [f"scale=True, scoring={name}, scoring={name}" for name in ("dot_unscaled", "additive", "dot")],
    "files'": [f"train=/work/shared/data/{d}/{d}.train, val=/work/shared/data/{d}/{d}.dev, epochs=10" for d in "ab"],
}


@pytest.mark.parametrize("names", LONG_NAMES.values(), ids=LONG_NAMES)
def test_a_legend_of_long_series_names_fits_in_the_figure(names):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig, (ax,) = grid(1)
    for name in names:
        ax.plot([8, 64], [0.81, 0.82], label=name)
    legend_below(fig, [ax])
    FigureCanvasAgg(fig).draw()
    (legend,) = fig.legends
    box = legend.get_window_extent()
    assert box.x0 >= 0 and box.y0 >= 0 and box.x1 <= fig.bbox.width  # every name whole, none cut at the edges
    assert [t.get_text().replace("\n", " ") for t in legend.get_texts()] == names


def test_short_series_names_share_a_row_and_long_ones_wrap():
    assert legend_layout(["dropout=0.1", "dropout=0.3"], 6.0) == (3, ["dropout=0.1", "dropout=0.3"])
    path = "train=/work/shared/data/sst5/stsa.fine.train, val=/work/shared/data/sst5/stsa.fine.dev, max_epochs=10"
    columns, (wrapped,) = legend_layout([path], 6.0)  # longer than the figure is wide: one column, wrapped
    assert columns == 1 and "\n" in wrapped and wrapped.replace("\n", " ") == path
