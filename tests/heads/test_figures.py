"""The figures of heads: sized to their content, labelled, and a colour scale that shows diffuse heads."""

import io

import numpy as np
import pytest
from PIL import Image

from headlab.heads import figures


def attention(E: int, H: int, n: int, seed: int = 0) -> np.ndarray:
    w = np.random.default_rng(seed).random((E, H, n, n)) ** 4
    return w / w.sum(-1, keepdims=True)


def content_box(png: bytes) -> tuple[float, float]:
    """The fraction of the image's width and height that its non-white pixels span."""
    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("L"))
    rows, cols = np.nonzero(pixels < 250)
    return (cols.max() - cols.min() + 1) / pixels.shape[1], (rows.max() - rows.min() + 1) / pixels.shape[0]


@pytest.mark.parametrize(("heads", "n"), [(1, 6), (4, 20), (16, 12), (12, 8)])
def test_attention_maps_fill_their_figure_and_grow_with_heads_and_tokens(heads, n):
    tokens = [[f"t{i}" for i in range(n)] for _ in range(3)]
    png = figures.png(figures.attention_maps(attention(3, heads, n), tokens, title="layer 0"))
    width, height = content_box(png)
    assert width > 0.8 and height > 0.9  # no wide white margins
    image, side = Image.open(io.BytesIO(png)), figures._panel_inches(n)
    columns, rows = min(heads, 8), 3 * -(-heads // 8)  # 16 heads: two rows of 8 per example
    assert image.width == pytest.approx(100 * (side * columns + 1.2), abs=2)
    assert image.height == pytest.approx(100 * (side * rows + 0.9), abs=2)


def test_attention_maps_label_queries_keys_examples_and_heads():
    tokens = [["the", "cat", "sat"], ["a", "dog", "ran"]]
    fig = figures.attention_maps(attention(2, 2, 3), tokens, title="layer 1: attention")
    axes = fig.axes[:4]  # (example, head) panels, then the colour bar
    assert [ax.get_title() for ax in axes] == ["head 0", "head 1", "", ""]
    assert axes[0].get_ylabel() == "example 0: query" and axes[2].get_ylabel() == "example 1: query"
    assert axes[0].get_xlabel() == "key"
    assert [t.get_text() for t in axes[2].get_yticklabels()] == ["a", "dog", "ran"]
    assert [t.get_text() for t in axes[0].get_xticklabels()] == ["the", "cat", "sat"]
    assert fig._suptitle.get_text() == "layer 1: attention"
    assert fig.axes[-1].get_ylabel() == "attention weight (log scale)"


def test_a_diffuse_head_shows_its_structure_on_the_colour_scale():
    """Weights 10% either side of uniform (1/n) are far apart in colour, not one uniform block."""
    n = 32
    fig = figures.attention_maps(np.full((1, 1, n, n), 1 / n), [[str(i) for i in range(n)]])
    norm = fig.axes[0].images[0].norm
    low, high = norm(0.9 / n), norm(1.1 / n)
    assert high - low > 5 * (0.2 / n)  # on a linear 0..1 scale they would be 0.2 / n apart
    assert 0.3 < norm(1 / n) < 0.7  # a uniform head sits mid-scale, apart from both peaked and empty rows


def test_similarity_figure_plots_similarity_not_divergence():
    divergence = np.array([[0.0, np.log(2)], [np.log(2), 0.0]])
    fig = figures.similarity_map(divergence, n_heads=2)
    shown = fig.axes[0].images[0].get_array()
    assert np.allclose(shown, [[1, 0], [0, 1]])
    assert "similarity" in fig.axes[0].get_title() and [t.get_text() for t in fig.axes[0].get_xticklabels()] == [
        "L0H0",
        "L0H1",
    ]


def test_importance_and_pruning_figures_say_what_they_plot():
    fig = figures.importance_map(np.array([[0.6, 0.8], [1.0, 0.0]]), split="train")
    assert fig.axes[0].get_title() == "head importance on train (normalised per layer)"
    assert sorted(t.get_text() for t in fig.axes[0].texts) == ["0.00", "0.60", "0.80", "1.00"]
    curve = [{"fraction_pruned": f, "metric": 1 - f} for f in (0, 0.5, 1)]
    fig = figures.pruning_curves({"importance": curve, "random": curve}, "val accuracy")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "fraction of heads masked" and ax.get_ylabel() == "val accuracy"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["importance", "random"]


def test_an_accuracy_axis_shows_chance_and_does_not_magnify_runs_at_chance():
    from matplotlib.figure import Figure

    from headlab.compare.figures import MIN_SPAN, frame_accuracy

    ax = Figure().subplots()
    ax.plot([1, 2, 4], [0.101, 0.103, 0.102])  # three arms at chance (19 classes: 0.053)
    frame_accuracy(ax, [{"chance": 1 / 19}] * 3)
    low, high = ax.get_ylim()
    assert high - low >= MIN_SPAN and low <= 1 / 19 <= high
    assert [line.get_label() for line in ax.get_lines()][-1] == "chance (0.0526)"

    # runs far above chance (SST-2: 0.79-0.82 against 0.5) keep an axis on their differences, and say where chance is
    ax = Figure().subplots()
    ax.plot([1, 2, 4], [0.79, 0.82, 0.80])
    frame_accuracy(ax, [{"chance": 0.5}] * 3)
    low, high = ax.get_ylim()
    assert high - low >= MIN_SPAN and low > 0.6 and high <= 0.9
    assert [line.get_label() for line in ax.get_lines()][-1] == "chance (0.5): below the axis"


def test_importance_values_are_legible_on_any_cell():
    """Each value's colour follows its cell's luminance: white on the dark reds, black on the light ones."""
    fig = figures.importance_map(np.array([[0.1, 0.45, 0.6, 0.9]]))
    colours = {text.get_text(): text.get_color() for text in fig.axes[0].texts}
    assert colours["0.10"] == "black" and colours["0.90"] == "white"
