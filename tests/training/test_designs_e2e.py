"""Every head design through the real CLI: as a single run and as a pack member (equal to its single run), in a
sweep's compare table, under DDP, resumed; runs recorded before the design keys existed still resume."""

import json
from pathlib import Path

import pytest
import yaml

from conftest import PACKED, ROOT, TINY, as_interrupted, cli_here, headlab_train

DESIGNS = sorted(p.stem for p in (ROOT / "conf" / "design").glob("*.yaml"))
COMMON = [*TINY, "logger=csv", "model.d_model=32", "model.n_layers=2"]  # 32: the latent's rank 16 is below the width;
# 2 layers: the value residual mixes the first layer's values into the second's


def records(sweep: Path, seed: int) -> dict[str, dict]:
    """design -> its run's results.json, for every job of a sweep with that seed."""
    found = [json.loads(p.read_text()) for p in sweep.glob("*/results.json")]
    return {r["config"]["design"]: r for r in found if r["seed"] == seed}


@pytest.mark.e2e
def test_every_design_trains_alone_and_in_a_pack_and_compares(run_cli, tmp_path):
    """Each design packed with a second seed of itself (designs differ in their config, so each is a pack of its
    own: two members), computed each way (batched: one vmap computation over the members, the explicit attention
    path; each: one after another on views of the stacked parameters), its seed-1 member against the same run alone
    (its model's own kernels)."""
    assert {"plain", "gate_headwise", "differential", "sigmoid", "latent_kv", "latent_kv_8"} <= set(DESIGNS)
    designs = f"+design={','.join(DESIGNS)}"
    common = [*COMMON, "trainer.max_epochs=1"]  # eight steps: a member's every step is its single run's
    packed = run_cli(  # batched, not auto: the way each design computes is not left to a timing
        "-m", *PACKED, designs, "seed=0,1", *common, "pack.compute=batched",
        "hydra.sweep.dir=packed",
    )  # fmt: skip
    assert packed.returncode == 0, packed.stderr[-3000:]
    numbers_only = ["callbacks.attention=null"]  # the head logging draws from no random stream training uses (the
    # members' analysis: below)
    each = run_cli(
        "-m", *PACKED, designs, "seed=0,1", *common, *numbers_only, "pack.compute=each",
        "hydra.sweep.dir=each",
    )  # fmt: skip
    assert each.returncode == 0, each.stderr[-3000:]
    alone = run_cli("-m", designs, "seed=1", *common, *numbers_only, "hydra.sweep.dir=alone")
    assert alone.returncode == 0, alone.stderr[-3000:]
    singles = records(tmp_path / "alone", 1)
    assert sorted(singles) == sorted(records(tmp_path / "packed", 0)) == DESIGNS
    for way in ("batched", "each"):
        members = records(tmp_path / ("packed" if way == "batched" else way), 1)
        assert sorted(members) == DESIGNS
        for design, member in members.items():
            assert member["status"] == singles[design]["status"] == "completed", (way, design)
            assert member["pack"]["size"] == 2 and member["pack"]["compute"] == way, (way, design)
            assert "pack" not in singles[design], design
            # float32 on a CPU, the same seed: the pack's member is its single run (to rounding)
            single = singles[design]["metrics"]["test/loss"]
            assert member["metrics"]["test/loss"] == pytest.approx(single, abs=1e-4), (way, design)
            assert member["params"] == singles[design]["params"] and member["flops_per_token"] > 0
    members = records(tmp_path / "packed", 1)

    plain = members["plain"]
    assert members["latent_kv"]["params"]["attention"] < plain["params"]["attention"]
    assert members["gate_elementwise"]["params"]["attention"] > members["gate_headwise"]["params"]["attention"]
    assert members["talking_heads"]["flops_per_token"] > plain["flops_per_token"]
    reports = []  # every member's, both seeds
    for path in (tmp_path / "packed").glob("*/heads.json"):
        config = json.loads((path.parent / "results.json").read_text())["config"]
        reports.append((config["design"], json.loads(path.read_text())))
    assert len(reports) == 2 * len(DESIGNS)
    for design, report in reports:
        assert all(
            isinstance(v, float) and abs(v) < 1e6
            for r in report["rows"]
            for k, v in r.items()
            if k not in ("layer", "head", "role")
        ), design
        masses = [r["mass"] for r in report["rows"]]
        if design in ("softmax1", "sink"):
            assert all(0 < m < 1 for m in masses), design  # the rest goes to no key
        elif design in ("plain", "gate_headwise", "gate_elementwise", "qk_norm", "latent_kv"):
            assert masses == pytest.approx([1.0] * len(masses), abs=1e-5), design
        assert ("gate" in report["rows"][0]) == design.startswith("gate_"), design
        assert ("mixing" in report) == (design == "talking_heads"), design
        assert ("load" in report["rows"][0]) == design.startswith("moh"), design
        if design.startswith("moh"):  # one shared head always on, 2 of the other 3 at every position
            for layer in (0, 1):
                loads = [r["load"] for r in report["rows"] if r["layer"] == layer]
                assert loads[0] == 1.0 and sum(loads[1:]) == pytest.approx(2.0), loads
        assert "importance" in report["rows"][0] and report["pruning_curve"], design
    assert (
        (tmp_path / "packed")
        .joinpath(
            next(
                p.parent.name
                for p in (tmp_path / "packed").glob("*/results.json")
                if json.loads(p.read_text())["config"]["design"] == "differential"
            ),
            "heads",
            "view.html",
        )
        .is_file()
    )

    compare = cli_here(
        "compare", "packed", "--metric", "test/acc", "--metric", "heads/mass", "--no-plots", cwd=tmp_path
    )
    assert compare.returncode == 0, compare.stderr[-2000:]
    table = (tmp_path / "packed" / "compare.md").read_text()
    for design in DESIGNS:
        assert f"| {design} " in table or f"design={design}" in table, design
    assert "heads/mass" in table


@pytest.mark.e2e
def test_a_design_resumes_and_a_run_recorded_before_the_design_keys_resumes_too(run_cli, tmp_path):
    first = run_cli(*COMMON, "+design=differential", "hydra.run.dir=run")
    assert first.returncode == 0, first.stderr[-2000:]
    run = as_interrupted(tmp_path / "run")
    refused = run_cli(f"resume={run}", "model.attention.differential=false")
    assert refused.returncode == 2 and "model.attention.differential=false is invalid: expected True" in refused.stderr
    assert run_cli(f"resume={run}").returncode == 0

    old = run_cli(*COMMON, "hydra.run.dir=old")  # as a run of the code before the designs recorded itself:
    assert old.returncode == 0, old.stderr[-2000:]
    old_run = as_interrupted(tmp_path / "old")
    designs = ("normalizer", "gate", "talking_heads", "differential", "qk_norm", "latent_kv")
    record = json.loads((old_run / "results.json").read_text())
    record["config"] = {k: v for k, v in record["config"].items() if k.rsplit(".", 1)[-1] not in designs}
    (old_run / "results.json").write_text(json.dumps(record))
    saved = yaml.safe_load((old_run / ".hydra" / "config.yaml").read_text())
    saved["model"]["attention"] = {k: v for k, v in saved["model"]["attention"].items() if k not in designs}
    (old_run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    resumed = run_cli(f"resume={old_run}")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads((old_run / "results.json").read_text())["status"] == "completed"


@pytest.mark.e2e
def test_a_design_trains_under_ddp(tmp_path):
    result = headlab_train(
        *COMMON, "trainer=ddp_cpu", "trainer.max_epochs=1", "+design=talking_heads", "hydra.run.dir=run", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((tmp_path / "run" / "results.json").read_text())
    assert record["status"] == "completed" and record["resources"]["devices"] == 2
    assert record["config"]["model.attention.talking_heads"] == "both"
    assert "mixing" in json.loads((tmp_path / "run" / "heads.json").read_text())


def test_impossible_designs_are_refused_in_one_line_before_anything_is_built(tmp_path):
    result = headlab_train("+design=differential", "model.attention.talking_heads=pre", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "headlab-train: invalid config: model.attention.talking_heads='pre' is invalid: expected none while "
        "model.attention.differential=true"
    )
    assert not list(tmp_path.rglob("results.json"))
