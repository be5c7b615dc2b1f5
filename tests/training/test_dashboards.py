"""What the dashboards' own readers find in one real run: W&B's offline run file (config, tags, history, summary),
TensorBoard's EventAccumulator (images, one HParams session with the final metrics), headlab-compare --wandb on
the records W&B's API would return, and the interactive head view in a real headless Chromium."""

import json
import math
from pathlib import Path

import pytest
import torch

from conftest import DRAWN, TINY, launcher_overrides, train_here
from headlab.heads import statistics
from headlab.launch.wandb_offline import read_run

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A two-layer run logged to W&B (offline) and TensorBoard at once."""
    where = tmp_path_factory.mktemp("dashboards")
    result = train_here(*DRAWN, "logger=[wandb,tensorboard]", "model.n_layers=2", "hydra.run.dir=run", cwd=where)
    assert result.returncode == 0, result.stderr[-3000:]
    return where / "run"


def results(run: Path) -> dict:
    return json.loads((run / "results.json").read_text())


def test_wandb_run_holds_media_tables_head_scalars_and_the_flat_config(run):
    logged = read_run(run)
    keys = set().union(*logged["history"])
    for layer in (0, 1):  # one attention image per layer
        assert f"attention/layer_{layer}/_type" in keys
    image_types = {h["attention/layer_1/_type"] for h in logged["history"] if "attention/layer_1/_type" in h}
    assert image_types == {"image-file"}
    for media in ("heads/table", "heads/similarity", "heads/pruning_table", "heads/importance", "heads/view"):
        assert f"{media}/_type" in keys, media
    head_scalars = {k for k in keys if k.startswith("heads/L") and not k.endswith("/importance")}
    # every statistic, the share on the keys a query needs, and the causal scores (three ablations' loss and
    # accuracy, two corruptions' patching) of each of 2 x 4 heads
    assert len(head_scalars) == 2 * 4 * (len(statistics.STATISTICS) + 1 + 6 + 2)
    assert {"heads/L1/H3/score_std", "heads/L1/H3/relevant", "heads/L0/H2/restore_key_b"} <= head_scalars
    assert {"val/acc", "val/loss", "test/acc"} <= keys
    config = logged["config"]
    assert config["model.attention.n_heads"] == 4 and config["model.attention.scoring"] == "dot"
    assert config["data"] == "pair_recall" and config["seed"] == 0 and config["model.attention.d_k"] is None
    assert results(run)["wandb"]["id"] == logged["run"].run_id and results(run)["wandb"]["url"] is None
    assert len(list(run.glob("wandb/offline-run-*/files/media/images/attention/*.png"))) >= 2
    (page,) = run.glob("wandb/offline-run-*/files/media/html/heads/view_*.html")  # as is: nothing fetched online
    assert page.read_text() == (run / "heads" / "view.html").read_text()


def test_wandb_config_has_the_resolved_head_sizes_parameters_flops_dataset_and_commit(run):
    config, record = read_run(run)["config"], results(run)
    assert (config["resolved.d_k"], config["resolved.d_v"], config["resolved.n_kv_heads"]) == (4, 4, 4)  # 16 / 4
    assert config["resolved.n_heads"] == 4 and config["resolved.d_ff"] == 64
    assert config["params.total"] == record["params"]["total"] and config["params.attention"] == 2 * (
        4 * 16 * 16 + 4 * 16
    )
    assert config["flops_per_token"] == record["flops_per_token"] > 0
    assert config["dataset"] == "pair_recall" and config["commit"] == record["git_sha"]
    assert record["heads"] == {"n_heads": 4, "d_k": 4, "d_v": 4, "n_kv_heads": 4}
    assert str(run) not in json.dumps(config)  # where the run ran is results.json's, not the dashboard's
    assert (
        "callbacks.model_checkpoint.dirpath" in record["config"] and "callbacks.model_checkpoint.dirpath" not in config
    )


def test_the_dashboards_name_a_released_file_from_headlab_data_and_the_dataset_by_its_config(tmp_path, monkeypatch):
    from headlab.training.loggers import run_facts, shown

    monkeypatch.setenv("HEADLAB_DATA", str(tmp_path / "data"))
    config = {"data": "cr", "data.files.train": str(tmp_path / "data" / "cr" / "custrev.all"), "seed": 0,
              "logger.csv.save_dir": str(tmp_path / "run"), "data.files.test": "/elsewhere/mine.tsv"}  # fmt: skip
    assert shown(config) == {
        "data": "cr",
        "data.files.train": "$HEADLAB_DATA/cr/custrev.all",
        "seed": 0,
        "data.files.test": "/elsewhere/mine.tsv",
    }  # fmt: skip  (a user's own file: as given)
    fields = {"heads": {}, "d_ff": 64, "params": {"total": 1, "attention": 1}, "flops_per_token": 1}
    assert run_facts(fields, config)["dataset"] == "cr"
    assert run_facts(fields, {"data": "files", "data.files.train": "/x/reviews.tsv"})["dataset"] == "reviews.tsv"


def test_wandb_tags_come_from_the_configuration(run):
    assert set(read_run(run)["run"].tags) == {"scoring:dot", "heads:4", "layers:2", "data:pair_recall"}


def test_wandb_summary_holds_final_metrics_and_importance_as_plain_numbers(run):
    summary, record = read_run(run)["summary"], results(run)
    for key in ("val/acc_best", "test/acc", "test/loss", "val/acc"):
        assert isinstance(summary[key], float) and summary[key] == pytest.approx(record["metrics"][key], abs=1e-9)
    heads = json.loads((run / "heads.json").read_text())
    for row in heads["rows"]:
        assert summary[f"heads/L{row['layer']}/H{row['head']}/importance"] == pytest.approx(row["importance"])


def test_compare_reads_what_the_wandb_api_returns_for_these_runs(run, tmp_path, monkeypatch):
    """Records shaped as wandb.Api().runs() gives them (config values, summary with media as dicts), captured from
    this real offline run and a second one with another head count."""
    import wandb

    from headlab.cli import compare
    from headlab.compare.sources import load_wandb

    logged = read_run(run)

    class ApiRun:
        def __init__(self, heads: int, acc: float):
            self.config = {**logged["config"], "model.attention.n_heads": heads}
            self.summary = {**logged["summary"], "val/acc_best": {"max": acc}, "test/acc": acc}
            self.url, self.state = f"https://wandb.example/{heads}", "finished"

    api_runs = [ApiRun(4, 0.5), ApiRun(2, 0.25), ApiRun(2, 0.75)]
    assert any(isinstance(v, dict) and v.get("_type") for v in api_runs[0].summary.values())  # media entries

    class Api:
        def __init__(self, timeout):
            pass

        def runs(self, path, filters):
            return api_runs

    monkeypatch.setattr(wandb, "Api", Api)
    runs = load_wandb("entity/project", None)
    assert len(runs.completed) == 3 and not runs.failed
    compare.main(["--wandb", "entity/project", "--out", str(tmp_path / "cmp")])
    table = (tmp_path / "cmp" / "compare.csv").read_text().splitlines()
    header = table[0].split(",")
    rows = {r.split(",")[0]: dict(zip(header, r.split(","), strict=True)) for r in table[1:]}
    assert float(rows["2"]["test/acc_mean"]) == pytest.approx(0.5) and float(rows["4"]["test/acc_mean"]) == 0.5


def test_tensorboard_has_the_figures_and_one_hparams_session_with_the_final_metrics(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    expected = {"attention/layer_0", "attention/layer_1", "heads/similarity", "heads/importance_map"}
    assert expected | {"heads/pruning_curves"} <= set(events.Tags()["images"])
    image = events.Images("attention/layer_0")[-1]
    assert image.encoded_image_string[:4] == b"\x89PNG" and image.width > 200
    hparams = events.PluginTagToContent("hparams")
    sessions = [k for k in hparams if k.endswith("session_start_info")]
    assert len(sessions) == 1  # one per run: no second session from the test stage, no placeholder
    start = plugin_data_pb2.HParamsPluginData.FromString(hparams[sessions[0]]).session_start_info
    assert start.hparams["model.attention.n_heads"].number_value == 4
    assert start.hparams["resolved.d_k"].number_value == 4 and start.hparams["data"].string_value == "pair_recall"
    metrics = results(run)["metrics"]
    assert events.Scalars("hp_metric")[-1].value == pytest.approx(metrics["val/acc_best"])
    assert events.Scalars("test/acc")[-1].value == pytest.approx(metrics["test/acc"])
    assert not [k for k in hparams if k.endswith("experiment")]  # a sweep's view states the experiment
    # in the order they were written, a run's steps never go back (TensorBoard reads that as a restart): the
    # heads' statistics of an epoch share its metrics' step
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    written = sorted((run / "tensorboard").rglob("events.out.tfevents*"), key=lambda f: f.name.rsplit(".", 2)[-2:])
    steps = [
        (e.step, e.summary.value[0].tag)
        for f in written
        for e in EventFileLoader(str(f)).Load()
        if e.summary.value and not e.summary.value[0].tag.startswith("_hparams_/")
    ]
    back = [(a, b) for a, b in zip(steps, steps[1:], strict=False) if b[0] < a[0]]
    assert not back, back[:3]
    assert {t for s, t in steps if t.startswith("heads/L0/H0/")} and steps[-1][0] == results(run)["global_step"]
    # the head view's title names one step: the checkpoint its weights are from
    best = Path(results(run)["checkpoints"]["best"]).name
    assert f'"title":"{run.name}: heads of {best}"' in (run / "heads" / "view.html").read_text()


@pytest.mark.parametrize("launcher", ["basic", "packed"])
def test_head_statistics_reach_the_dashboards_at_every_validation_and_figures_at_their_own_cadence(
    run_cli, tmp_path, launcher
):
    """A curve per head with a point per validation (one probe pass each); the maps, whose drawing is most of the
    cost, every figures_every_n_val_epochs validations and after the last: here validations 2 and 3 of 3."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    done = run_cli(
        "-m", *TINY, "trainer.max_epochs=3", "seed=0,1", "logger=tensorboard", *launcher_overrides(launcher),
        "callbacks.attention.importance=false", "callbacks.attention.figures_every_n_val_epochs=2",
        "hydra.sweep.dir=sweep",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for job in ("0", "1"):
        events = EventAccumulator(str(tmp_path / "sweep" / job / "tensorboard"), size_guidance={"images": 0})
        events.Reload()
        validations = [7, 15, 23]  # each epoch's last step: 256 examples in batches of 32
        assert [e.step for e in events.Scalars("val/acc")][:3] == validations
        assert [e.step for e in events.Scalars("heads/L0/H0/entropy")] == validations
        assert [e.step for e in events.Images("attention/layer_0")] == validations[1:]


@pytest.mark.parametrize("launcher", ["basic", "packed"])
def test_no_figures_leaves_the_dashboards_every_number_and_draws_nothing(run_cli, tmp_path, launcher):
    """figures_every_n_val_epochs=0: no attention map, similarity or importance figure reaches TensorBoard or W&B,
    nor a head table to W&B, while every head's statistics (at each validation) and importance do, and heads.json and
    the head view are written."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    done = run_cli(
        "-m", *TINY, "seed=0", "logger=[tensorboard,wandb]", *launcher_overrides(launcher),
        "callbacks.attention.figures_every_n_val_epochs=0", "hydra.sweep.dir=sweep",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "sweep" / "0"
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    assert events.Tags()["images"] == []
    assert [e.step for e in events.Scalars("heads/L0/H0/entropy")][:2] == [7, 15]  # both validations
    assert events.Scalars("heads/L0/H0/importance")
    keys = set().union(*read_run(run)["history"])
    assert {k for k in keys if k.endswith("/_type")} == {"heads/view/_type"}  # the page, as with figures
    assert {"heads/L0/H0/entropy", "heads/L0/H0/importance"} <= keys
    assert isinstance(json.loads((run / "heads.json").read_text())["rows"][0]["importance"], float)
    assert (run / "heads" / "view.html").is_file()


@pytest.mark.e2e
def test_a_sweeps_tensorboard_names_runs_by_what_varies_and_opens_hparams_on_the_comparison(run_cli, tmp_path):
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer
    from tensorboard.plugins.hparams import plugin_data_pb2

    done = run_cli(
        "-m", "model.attention.n_heads=1,2", "seed=0,1", *TINY, "trainer.max_epochs=1", "logger=tensorboard",
        "callbacks.attention.importance=false", "hydra.sweep.dir=sweep",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"tensorboard --logdir {Path('sweep') / 'tensorboard'}" in done.stdout
    runs = EventMultiplexer()
    runs.AddRunsFromDirectory(str(tmp_path / "sweep" / "tensorboard"))
    runs.Reload()
    named = {"n_heads=1,seed=0", "n_heads=1,seed=1", "n_heads=2,seed=0", "n_heads=2,seed=1"}
    assert set(runs.Runs()) == named | {"."}
    content = runs.PluginRunToTagToContent("hparams")
    experiments = [(run, t) for run, tags in content.items() for t in tags if t.endswith("experiment")]
    assert experiments == [(".", "_hparams_/experiment")]  # one experiment: the sweep's
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["."]["_hparams_/experiment"]).experiment
    shown = [h.name for h in experiment.hparam_infos]
    assert shown[0] == "model.attention.n_heads" and {"resolved.d_k", "params.total"} <= set(shown)
    assert len(shown) <= 10  # not the ~90 keys of a run's config
    assert [m.name.tag for m in experiment.metric_infos][0] == "val/acc_best"  # the sweep's objective first
    for name in named:  # each run its session, with the values the experiment lists
        start = plugin_data_pb2.HParamsPluginData.FromString(content[name]["_hparams_/session_start_info"])
        assert start.session_start_info.hparams["model.attention.n_heads"].number_value == float(name[8])
        assert runs.Scalars(name, "val/acc_best")


def test_a_cross_validated_sweeps_runs_are_named_and_listed_by_their_fold():
    """Runs of one setting differ by fold (one seed): each TensorBoard run says its fold, and the HParams table
    lists it, where the fold was left out and runs of one setting were told apart only by their job's number."""
    from headlab.launch.tensorboard import labels, replicates

    runs = [
        {"config": {"model.attention.n_heads": h, "seed": 1, "data.cv.fold": f}, "where": f"sweep/{2 * i + f}"}
        for i, h in enumerate((1, 4))
        for f in (0, 1)
    ]
    assert replicates(runs) == ["data.cv.fold"]
    assert labels(runs, ["model.attention.n_heads"]) == [
        "n_heads=1,fold=0",
        "n_heads=1,fold=1",
        "n_heads=4,fold=0",
        "n_heads=4,fold=1",
    ]
    for run, seed in zip(runs, (0, 1, 0, 1), strict=True):
        run["config"]["seed"] = seed
    assert replicates(runs) == ["seed", "data.cv.fold"]
    assert labels(runs, ["model.attention.n_heads"])[1] == "n_heads=1,seed=1,fold=1"


def probe_attention(run: Path, checkpoint: str) -> tuple[list[str], list]:
    """Example 0 of the probe set, computed here from the checkpoint: its tokens and every layer's weights."""
    from omegaconf import OmegaConf

    from headlab.training.build import build

    datamodule, model = build(OmegaConf.load(run / ".hydra" / "config.yaml"))
    state = torch.load(checkpoint, weights_only=True)["state_dict"]
    model.load_state_dict({k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")})
    probe = datamodule.probe_batch(16)
    n = int((~probe["padding_mask"][0]).sum())
    with torch.no_grad():
        _, weights = model.eval()(probe["tokens"][:1, :n], probe["padding_mask"][:1, :n], need_weights=True)
    return datamodule.token_strings(probe["tokens"][0, :n]), [w[0] for w in weights]


def drawn(driver) -> dict[tuple, float]:
    """(head, query, key) -> weight of every attention line drawn."""
    lines = driver.execute_script(
        "return [...document.querySelectorAll('line.attn')].map(l => [l.dataset.head, l.dataset.query, "
        "l.dataset.key, l.getAttribute('stroke-opacity')])"
    )
    return {(int(h), int(q), int(k)): float(w) for h, q, k, w in lines}


def test_head_view_renders_the_probe_tokens_and_switching_heads_changes_what_is_drawn(run, browser):
    heads = json.loads((run / "heads.json").read_text())
    tokens, weights = probe_attention(run, heads["checkpoint"])
    browser.get((run / "heads" / "view.html").as_uri())
    queries = [e.text.split(" [")[0] for e in browser.find_elements("css selector", "text.token.query")]
    assert queries == tokens and len(tokens) > 5  # (scored query positions also show [label|prediction])

    def expected(layer: int, head: int) -> dict:
        w = weights[layer][head]
        return {
            (head, q, k): float(w[q, k]) for q in range(len(tokens)) for k in range(len(tokens)) if w[q, k] >= 0.0105
        }

    first = drawn(browser)  # layer 0, head 0 at first
    assert {key for key in first if first[key] >= 0.0105} == set(expected(0, 0))
    assert all(abs(first[key] - w) <= 6e-4 for key, w in expected(0, 0).items())

    browser.find_element("css selector", "input[data-head='0']").click()  # head 0 off, head 2 on
    browser.find_element("css selector", "input[data-head='2']").click()
    second = drawn(browser)
    assert {h for h, _, _ in second} == {2} and second != first
    assert all(abs(second[key] - w) <= 6e-4 for key, w in expected(0, 2).items())

    browser.find_element("css selector", "#layer option[value='1']").click()
    third = drawn(browser)
    assert all(abs(third[key] - w) <= 6e-4 for key, w in expected(1, 2).items()) and third != second

    stats = browser.find_elements("css selector", "#stats tr[data-head]")
    assert [row.get_attribute("data-head") for row in stats] == ["2"]
    row = next(r for r in heads["rows"] if (r["layer"], r["head"]) == (1, 2))
    columns = [c.text for c in browser.find_elements("css selector", "#stats th")]
    cells = [c.text for c in stats[0].find_elements("css selector", "td")]

    def number(v: float) -> str:  # three decimals, three significant digits below 0.01 (JavaScript's toPrecision)
        return f"{v:.3f}" if v == 0 or abs(v) >= 0.01 else f"{v:.{2 - math.floor(math.log10(abs(v)))}f}"

    for name in ("importance", "ablate_mean_loss", "restore_key_b", "role"):  # causal scores beside each head
        shown = row[name] if name == "role" else number(row[name])
        assert cells[columns.index(name.replace("_", " "))] == shown, name

    browser.find_element("css selector", "#mode option[value='matrix']").click()
    cells = browser.find_elements("css selector", "rect.cell")
    assert len(cells) == len(tokens) ** 2 and not browser.find_elements("css selector", "line.attn")


def test_head_view_works_as_bertviz_does_and_says_what_the_heads_do(run, browser):
    """Hovering a key shows only the lines into it; double-clicking a head shows it alone; with every head shown,
    each query's strongest key only (not a blob); matrices fit the page, label their keys and give each value on
    hover; the example's labels and predictions, the task's token notation, and where each head looks over all
    probe queries (as heads.json has it) are on the page."""
    heads = json.loads((run / "heads.json").read_text())
    browser.set_window_size(1200, 900)
    browser.get((run / "heads" / "view.html").as_uri())
    script = browser.execute_script
    assert "kA+bB: a query naming keys A (a) and B (b)" in browser.find_element("id", "notation").text
    assert "scored positions predicted right" in browser.find_element("id", "outcome").text

    key = browser.find_elements("css selector", "text.token.key")[5]
    browser.execute_script("arguments[0].dispatchEvent(new MouseEvent('mouseenter'))", key)
    shown = script(
        "return [...document.querySelectorAll('line.attn')].filter(l => l.style.display !== 'none')"
        ".map(l => Number(l.dataset.key))"
    )
    assert shown and set(shown) == {5}
    browser.execute_script("arguments[0].dispatchEvent(new MouseEvent('mouseleave'))", key)

    browser.find_element("id", "all").click()  # every head: each query's strongest key, one line a query and head
    n = len(browser.find_elements("css selector", "text.token.query"))
    lines = drawn(browser)
    per_query = {(h, q) for h, q, _ in lines}
    assert len(lines) == len(per_query) <= 4 * n and {h for h, _ in per_query} == {0, 1, 2, 3}

    label = browser.find_elements("css selector", "#heads label")[2]
    webdriver = pytest.importorskip("selenium.webdriver")
    webdriver.ActionChains(browser).double_click(label).perform()
    assert {h for h, _, _ in drawn(browser)} == {2}
    assert script("return [...document.querySelectorAll('#heads input')].map(b => b.checked)") == [
        False,
        False,
        True,
        False,
    ]

    roles = browser.find_elements("css selector", "#roles tr[data-head]")
    names = heads["attention_roles"]["names"]
    assert (
        [c.text for c in browser.find_elements("css selector", "#roles th")][1:]
        == names
        == ["key a", "key b", "other context", "queries"]
    )
    for row, share in zip(roles, heads["attention_roles"]["share"][0], strict=True):
        assert [c.text for c in row.find_elements("css selector", "td")][1:] == [f"{round(100 * v)}%" for v in share]
    uniform = browser.find_element("css selector", "#roles tr.uniform")  # the reference row docs/heads.md describes
    assert [c.text for c in uniform.find_elements("css selector", "td")] == [
        "uniform",
        *(f"{round(100 * v)}%" for v in heads["attention_roles"]["uniform"]),
    ]
    # a small statistic (a gate of 0.002) keeps its significant digits: 0.000 said nothing
    assert script("return [number(0.00234), number(-0.0041), number(0), number(0.5)]") == [
        "0.00234",
        "-0.00410",
        "0.000",
        "0.500",
    ]

    browser.find_element("id", "all").click()  # every head again
    browser.find_element("css selector", "#mode option[value='matrix']").click()
    assert len(browser.find_elements("css selector", "svg.matrix")) == 4
    assert script("return document.documentElement.scrollWidth <= window.innerWidth")  # no head cut off
    cell = browser.find_elements("css selector", "rect.cell")[1]
    title = cell.find_element("css selector", "title").get_attribute("textContent")
    assert title.startswith("head 0: ") and title.endswith(f"{float(cell.get_attribute('data-weight')):.3f}")
    assert len(browser.find_elements("css selector", "svg.matrix text.token.key")) == 4 * n  # keys labelled


def probe_vectors(run: Path, checkpoint: str, layer: int, head: int) -> tuple:
    """Example 0's query and key vectors of one head, computed here from the checkpoint at the attention's q and k
    (after any QK-norm), and the scale of their dot product."""
    from omegaconf import OmegaConf

    from headlab.training.build import build

    datamodule, model = build(OmegaConf.load(run / ".hydra" / "config.yaml"))
    state = torch.load(checkpoint, weights_only=True)["state_dict"]
    model.load_state_dict({k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")})
    probe = datamodule.probe_batch(16)
    n = int((~probe["padding_mask"][0]).sum())
    attn, seen = model.blocks[layer].attn, {}
    hooks = [getattr(attn, f"hook_{x}").register_forward_hook(lambda m, a, out, x=x: seen.update({x: out}))
             for x in "qk"]  # fmt: skip
    with torch.no_grad():
        model.eval()(probe["tokens"][:1, :n], probe["padding_mask"][:1, :n], need_weights=True)
    for hook in hooks:
        hook.remove()
    kv_head = head // (attn.n_heads // attn.n_kv_heads)
    return seen["q"][0, head].numpy(), seen["k"][0, kv_head].numpy(), attn.scale


def test_the_model_view_shows_every_layer_and_head_and_opens_one(run, browser):
    heads = json.loads((run / "heads.json").read_text())
    _, weights = probe_attention(run, heads["checkpoint"])
    browser.get((run / "heads" / "view.html").as_uri())
    browser.find_element("css selector", "#mode option[value='model']").click()
    thumbs = browser.find_elements("css selector", "svg.thumb")
    assert [(int(t.get_attribute("data-layer")), int(t.get_attribute("data-head"))) for t in thumbs] == [
        (layer, head) for layer in (0, 1) for head in range(4)
    ]
    thumbs[7].click()  # layer 1, head 3: opened alone in the lines view
    assert browser.find_element("id", "mode").get_attribute("value") == "lines"
    assert browser.find_element("id", "layer").get_attribute("value") == "1"
    lines = drawn(browser)
    assert {h for h, _, _ in lines} == {3}
    w = weights[1][3]
    assert all(abs(lines[(3, q, k)] - float(w[q, k])) <= 6e-4 for (_, q, k) in lines)


def test_the_neuron_view_shows_the_vectors_behind_a_weight(run, browser):
    """Layer 1, head 2, query 3: the page's q and each key's k are the model's (computed here from the checkpoint),
    each product cell is their product, each score their dot product times the scale, and the softmax of the
    scores over the keys gives the weights shown."""
    heads = json.loads((run / "heads.json").read_text())
    q, k, scale = probe_vectors(run, heads["checkpoint"], layer=1, head=2)
    browser.get((run / "heads" / "view.html").as_uri())
    webdriver = pytest.importorskip("selenium.webdriver")
    webdriver.ActionChains(browser).double_click(browser.find_elements("css selector", "#heads label")[2]).perform()
    browser.find_element("css selector", "#layer option[value='1']").click()
    browser.find_element("css selector", "#mode option[value='neuron']").click()
    browser.find_element("css selector", "#query option[value='3']").click()
    values = lambda row, kind: [
        float(c.get_attribute("data-value")) for c in row.find_elements("css selector", f"td.{kind}")
    ]  # noqa: E731, E501
    query = browser.find_element("css selector", "#neuron tr.query")
    assert values(query, "q") == pytest.approx(q[3], abs=6e-4)
    rows = browser.find_elements("css selector", "#neuron tr.key")
    assert len(rows) == len(k)
    scores, shown = [], []
    for j, row in enumerate(rows):
        assert values(row, "k") == pytest.approx(k[j], abs=6e-4)
        assert values(row, "qk") == pytest.approx(q[3] * k[j], abs=2e-3)
        scores.append(float(row.find_element("css selector", "td.score").text))
        shown.append(float(row.find_element("css selector", "td.weight").text))
    assert scores == pytest.approx((k @ q[3] * scale).tolist(), abs=5e-3)
    softmax = torch.softmax(torch.tensor(scores, dtype=torch.float64), 0).tolist()
    assert shown == pytest.approx(softmax, abs=5e-3)  # the normaliser turns these scores into these weights
    assert "layer 1, head 2: query 3" in browser.find_element("css selector", "#neuron caption").text
