"""A sweep's jobs composed once per group of jobs that differ only in per-member values (headlab.launch.compose),
and a single run composed once (headlab.cli.train): every config equal to Hydra's own composition of it."""

import json

import pytest
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import create_config_search_path
from hydra.types import RunMode
from omegaconf import OmegaConf

from conftest import PACKED, TINY, train_here
from headlab.cli import train
from headlab.launch.compose import compose_jobs


class CountingLoader(ConfigLoaderImpl):
    """Hydra's config loader, counting the jobs it composes."""

    composed = 0

    def load_sweep_config(self, master_config, sweep_overrides):
        self.composed += 1
        return super().load_sweep_config(master_config, sweep_overrides)


def sweep(*overrides: str):
    loader = CountingLoader(config_search_path=create_config_search_path("pkg://headlab.conf"))
    master = [*PACKED, "hydra.sweep.dir=sweep", "data.n_train=500", *overrides]
    return loader, loader.load_configuration("train", master, run_mode=RunMode.MULTIRUN)


def test_every_job_composed_once_a_group_is_the_config_hydra_composes_for_it():
    loader, master = sweep("hydra.job.config.override_dirname.exclude_keys=[data.seed]")
    jobs = [
        [f"model.attention.n_heads={h}", f"seed={s}", f"optim.lr={lr}", "data.seed=3"]
        for h in (1, 2) for s in (0, 1, 2) for lr in (1e-3, "3e-4")
    ]  # fmt: skip
    jobs += [["seed=5"], ["+copy=a", "seed=1"], ["+copy=b", "seed=1"]]
    jobs += [["seed=4", "optim.betas=[0.8,0.9]"], ["optim.betas=[0.9,0.99]", "seed=4"], ["++seed=7"]]
    jobs += [["model=encoder", "seed=1", "callbacks.attention.seed=2"], ["seed=1", "model.dropout=0.1"]]
    ours = compose_jobs(loader, master, jobs)
    assert len(jobs) == 20 and loader.composed == 10  # 12 jobs in 2 groups, then a group each (a key's order too)
    for job, cfg in zip(jobs, ours, strict=True):
        hydras = loader.load_sweep_config(master, job)
        assert OmegaConf.to_container(cfg) == OmegaConf.to_container(hydras), job
    assert ours[1].optim.lr == 3e-4 and ours[0].optim.lr == 1e-3 and ours[1].data.seed == 3 and ours[1].seed == 0
    assert ours[0].hydra.job.override_dirname == "model.attention.n_heads=1,optim.lr=0.001,seed=0"


@pytest.mark.parametrize("given", [[], ["hydra.mode=RUN"]], ids=["mode unsaid", "mode=RUN"])
def test_a_run_is_composed_once_into_the_config_hydra_composes_for_it(monkeypatch, tmp_path, given):
    """headlab-train without -m: Hydra reads hydra.mode from a composition of its own, then composes the run's config
    again; headlab-train composes once and runs that, and the run's .hydra files are what Hydra alone writes."""
    counted = []
    load = ConfigLoaderImpl.load_configuration
    monkeypatch.setattr(ConfigLoaderImpl, "load_configuration", lambda *a, **k: counted.append(1) or load(*a, **k))
    overrides = [*TINY, "trainer.max_epochs=1", "logger=csv", "callbacks.attention=null", *given, "hydra.run.dir=run"]
    written = {}
    for way in ("headlab", "hydra"):
        if way == "hydra":  # Hydra's own get_mode: the composition of its own, then the run's
            monkeypatch.setattr(train, "_mode_of_the_run", lambda hydra, get_mode, **given: get_mode(hydra, **given))
        counted.clear()
        (tmp_path / way).mkdir()
        assert train_here(*overrides, cwd=tmp_path / way).returncode == 0
        assert len(counted) == (1 if way == "headlab" else 2)
        files = sorted((tmp_path / way / "run" / ".hydra").iterdir())
        written[way] = {f.name: f.read_text().replace(str(tmp_path / way), "<cwd>") for f in files}
    assert written["headlab"] == written["hydra"]
    assert "- hydra.mode=RUN" in written["headlab"]["hydra.yaml"]
    for name, text in written["headlab"].items():  # each as OmegaConf writes the config it holds (Hydra saves it so)
        assert text == OmegaConf.to_yaml(OmegaConf.create(text)), name


def test_a_sweeps_jobs_are_composed_once_a_group_where_the_basic_launcher_runs_them(monkeypatch, tmp_path):
    """Hydra's basic sweeper composes every job to check it before the first one runs, and its basic launcher each
    again to run it: headlab's grid sweeper composes once a group of jobs that differ only in per-member values,
    and the basic launcher runs each job on its own composition."""
    counted = []
    load = ConfigLoaderImpl.load_configuration
    monkeypatch.setattr(ConfigLoaderImpl, "load_configuration", lambda *a, **k: counted.append(1) or load(*a, **k))
    quick = [*TINY, "trainer.max_epochs=1", "logger=csv", "callbacks.attention=null", "hydra.sweep.dir=sweep"]
    done = train_here("-m", *quick, "model.attention.n_heads=1,2", "seed=0,1,2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(counted) == 1 + 2  # the sweep's own config, then one a head count (Hydra's sweeper: 1 + 6 + 6)
    for job in range(6):
        hydra = tmp_path / "sweep" / str(job) / ".hydra"
        given = dict(line[2:].split("=") for line in (hydra / "overrides.yaml").read_text().splitlines())
        cfg = OmegaConf.load(hydra / "config.yaml")
        assert (cfg.seed, cfg.model.attention.n_heads) == (int(given["seed"]), int(given["model.attention.n_heads"]))
        assert json.loads((hydra.parent / "results.json").read_text())["seed"] == cfg.seed


def test_a_dry_run_composes_once_a_group_of_jobs_it_prices(monkeypatch, tmp_path):
    """The default launcher's sweep of three seeds: one job a group to price, composed once for the three."""
    counted = []
    load = ConfigLoaderImpl.load_configuration
    monkeypatch.setattr(ConfigLoaderImpl, "load_configuration", lambda *a, **k: counted.append(1) or load(*a, **k))
    quick = [*TINY, "logger=csv", "callbacks.attention=null", "hydra.sweep.dir=sweep"]
    done = train_here("-m", *quick, "seed=0,1,2", "--dry-run", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(json.loads(done.stdout)["jobs"]) == 3
    assert len(counted) == 1 + 1  # the sweep's own config, then the seeds' (Hydra's loader, a job each: 1 + 3)
