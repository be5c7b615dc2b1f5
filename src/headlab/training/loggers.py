"""Experiment loggers. W&B goes offline by itself when it has no credentials or no network: it never prompts
and never blocks for long. Every logger gets the whole config as flat dotted keys, but for where the run ran
(loggers.shown)."""

import functools
import io
import logging
import netrc
import os
import threading
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from headlab.conventions import PATH_SUFFIXES, released_name
from headlab.errors import first_line
from headlab.files import write_text_atomic
from headlab.record import VAL_ACC_BEST

log = logging.getLogger("headlab")
INIT_TIMEOUT_S = 20  # then offline: the run goes on within 30 s of a W&B server that does not answer


def _has_credentials(host: str) -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


_said: set[str] = set()  # why W&B logs offline, as said in this process
_server_failed: set[str] = set()  # W&B servers that failed a run of this process: its later runs go offline at once


@functools.cache
def _answers(url: str, timeout: float = 3.0) -> bool:
    """Whether the server at url answers HTTP (any status) within `timeout` seconds in all: name lookup,
    connection and reply. Asked once per process, so a sweep of many runs pays for it once."""
    answered = []

    def ask() -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout).close()
            answered.append(True)
        except urllib.error.HTTPError:  # an answer, if not a welcome one
            answered.append(True)
        except Exception:  # no name, no route, refused, or no answer in time
            answered.append(False)

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    thread.join(timeout)  # a name lookup cannot be given a timeout of its own
    return bool(answered and answered[0])


def _base_url() -> str:
    return os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")


def wandb_mode() -> tuple[str, str | None]:
    """The mode W&B can run in here ('online', 'offline', 'disabled') and, when not online, why."""
    requested = os.environ.get("WANDB_MODE")
    if requested in ("offline", "disabled", "dryrun"):
        return requested, None
    base_url = _base_url()
    if not _has_credentials(urlparse(base_url).hostname):
        return "offline", "no W&B credentials (run `wandb login` or set WANDB_API_KEY)"
    if base_url in _server_failed:
        return "offline", f"{base_url} failed an earlier run of this process"
    if not _answers(base_url):
        _stop_reporting_errors()
        return "offline", f"{base_url} does not answer"
    return "online", None


def _stop_reporting_errors() -> None:
    """W&B's own error reports would hold the process up at exit, trying the server that failed (docs/runs.md has
    the figures, with a server that accepts connections and never answers)."""
    os.environ.setdefault("WANDB_ERROR_REPORTING", "false")


def run_identity(name: str | None, group: str | None) -> tuple[str | None, str | None]:
    """Run name from the job's overrides; group from the experiment, or the sweep, a multirun belongs to (given
    ones are kept; outside a Hydra job, as in a pack's training, they were set while the job was prepared)."""
    if not HydraConfig.initialized() or (name is not None and group is not None):
        return name, group
    hydra = HydraConfig.get()
    if name is None:
        name = hydra.job.override_dirname or None
    if group is None:
        experiment = hydra.runtime.choices.get("experiment")
        sweep = Path(hydra.sweep.dir).name if hydra.mode == RunMode.MULTIRUN else None
        group = "-".join(p for p in (experiment, sweep) if p) or None
    return name, group


def _previous_run_id(run_dir: str | None) -> str | None:
    """The W&B run id of an earlier attempt of this run: wandb/latest-run -> (offline-)run-<date>-<id>."""
    latest = Path(run_dir or "", "wandb", "latest-run")
    return latest.resolve().name.rsplit("-", 1)[-1] if run_dir and latest.exists() else None


def wandb_logger(
    project: str,
    save_dir: str,
    entity: str | None = None,
    name: str | None = None,
    group: str | None = None,
    job_type: str = "train",
    tags: tuple[str, ...] = (),
    resume_from: str | None = None,
):
    """Lightning's WandbLogger, offline when W&B cannot be reached (with a warning saying how to sync later).

    resume_from: the run directory of a run being resumed; its W&B run goes on (same id).
    """
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    mode, reason = wandb_mode()
    if reason and reason not in _said:  # once a process (a pack's members share it)
        _said.add(reason)
        log.warning("W&B logs offline: %s. Upload later with `wandb sync <run dir>/wandb/offline-run-*`", reason)
    name, group = run_identity(name, group)
    os.environ["WANDB_DIR"] = save_dir  # also where forked DDP ranks write the run's media
    timeout = float(os.environ.get("WANDB_INIT_TIMEOUT", INIT_TIMEOUT_S))
    settings = wandb.Settings(init_timeout=timeout, silent=True, reinit="create_new")  # a pack's members log at once
    logger = WandbLogger(
        project=project,
        entity=entity,
        name=name,
        group=group,
        job_type=job_type,
        tags=list(tags),
        id=_previous_run_id(resume_from),
        resume="allow",
        save_dir=save_dir,
        mode=mode,
        settings=settings,
    )
    logger._wandb_init.pop("anonymous", None)  # Lightning passes it; W&B warns that it has no effect
    return logger


def _init_or_go_offline(logger) -> None:
    """Start the W&B run; when the server fails or times out (wandb.init raises), start it offline instead."""
    try:
        logger.experiment  # noqa: B018 (the property calls wandb.init)
    except Exception as error:
        log.warning("W&B init failed (%s); logging offline instead", first_line(error))
        _server_failed.add(_base_url())
        _stop_reporting_errors()
        import wandb

        wandb.teardown()  # the service still waits on the server for the failed run
        logger._wandb_init["mode"] = "offline"  # WandbLogger keeps wandb.init's arguments here
        logger._experiment = None
        logger.experiment  # noqa: B018


def run_facts(fields: dict, config: dict) -> dict:
    """What a run derives from its config, as flat keys for the dashboards' configs (so that a plot can put
    accuracy against head size, parameters or compute): the resolved head sizes (resolved.d_k, ...), parameter
    counts, training FLOPs per token, the dataset and the commit. fields: results.json's (records.model_fields)."""
    from headlab.record import git_sha

    name, train = config.get("data"), config.get("data.files.train")
    dataset = name if name not in (None, "files") else config.get("data.hub") or (train and Path(train).name)
    return {
        **{f"resolved.{k}": v for k, v in fields["heads"].items()},
        "resolved.d_ff": fields["d_ff"],
        "params.total": fields["params"]["total"],
        "params.attention": fields["params"]["attention"],
        "flops_per_token": fields["flops_per_token"],
        "dataset": dataset,
        "commit": git_sha(),
    }


def shown(config: dict) -> dict:
    """The config as the dashboards get it: without the run's own directories (where it ran, not what it is:
    results.json keeps them), a file under $HEADLAB_DATA named from there, as every machine names it."""
    return {
        key: released_name(value) if key.startswith("data.files.") else value
        for key, value in config.items()
        if not key.endswith(PATH_SUFFIXES)
    }


def derived_tags(config: dict) -> list[str]:
    """W&B tags from the configuration, so that a workspace filters by scoring, head count, depth, data or
    experiment without anyone typing them: scoring:dot, heads:4, layers:1, data:sst2, experiment:scoring."""
    scoring = config.get("model.attention.scoring")
    if scoring == "dot" and config.get("model.attention.scale") is False:
        scoring = "dot_unscaled"
    named = {
        "scoring": scoring,
        "heads": config.get("model.attention.n_heads"),
        "layers": config.get("model.n_layers"),
        "data": config.get("data"),
        "experiment": config.get("experiment"),
    }
    tags = [f"{k}:{v}" for k, v in named.items() if v is not None]
    return [*tags, "packed"] if config.get("pack.id") else tags


def start(loggers: list, config: dict, resumed_step: int | None = None) -> None:
    """Give every logger the flat config (with what the run derived from it: run_facts); tag the W&B run from
    it. A run resumed from a checkpoint at resumed_step keeps the metrics.csv rows logged up to it."""
    from lightning.pytorch.loggers import CSVLogger, WandbLogger
    from lightning.pytorch.utilities import rank_zero_only

    for logger in loggers:
        if isinstance(logger, CSVLogger) and resumed_step is not None and rank_zero_only.rank == 0:
            _continue_csv(logger, resumed_step)
        if isinstance(logger, WandbLogger) and rank_zero_only.rank == 0:
            _init_or_go_offline(logger)
            run = logger.experiment
            run.tags = tuple(dict.fromkeys([*run.tags, *derived_tags(config)]))
        logger.log_hyperparams(shown(config))


def _continue_csv(logger, resumed_step: int) -> None:
    """Lightning's CSVLogger deletes metrics.csv when it starts in a directory that holds files. Keep the rows of
    the steps before the checkpoint (the ones after it are logged again as the run repeats them) and append."""
    import csv

    path = Path(logger.log_dir) / "metrics.csv"
    if not path.is_file():
        return
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        header, rows = list(reader.fieldnames or []), [r for r in reader if int(r["step"]) < resumed_step]
    writer = logger.experiment  # deletes the file
    kept = io.StringIO(newline="")
    out = csv.DictWriter(kept, fieldnames=header)
    out.writeheader()
    out.writerows(rows)
    write_text_atomic(path, kept.getvalue())
    writer.metrics_keys = header


def finish(loggers: list, failed: bool, summary: dict | None = None, config: dict | None = None, step: int = 0) -> dict:
    """Close the loggers with the run's final numbers (summary: metric -> float): W&B's summary holds them as plain
    numbers; TensorBoard gets one HParams session with the config and them (what its HParams dashboard compares;
    the experiment, which hyperparameters and metrics the dashboard shows, is the sweep's: headlab.launch.tensorboard).
    Returns the W&B run's {"id", "url"} for results.json (one W&B run per job, also in a multirun)."""
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger, WandbLogger
    from lightning.pytorch.utilities import rank_zero_only

    identity = {"id": None, "url": None}
    summary = {k: float(v) for k, v in (summary or {}).items() if v is not None}
    for logger in loggers:
        if rank_zero_only.rank != 0:
            continue
        if isinstance(logger, CSVLogger):  # the rows logged since its last save (a pack member's last epoch's
            logger.save()  # training means, its test): a pack's loggers are its own, not a Trainer's
        if isinstance(logger, TensorBoardLogger) and summary and not failed:
            best = summary.get(VAL_ACC_BEST, summary.get("val/acc"))
            metrics = {**summary, "hp_metric": best} if best is not None else summary
            _hparams_session(logger, shown(config or {}), metrics, step)
        if isinstance(logger, WandbLogger):
            run = logger.experiment
            run.summary.update(summary)
            identity = {"id": run.id, "url": None if run.settings._offline else run.url}
            run.finish(exit_code=1 if failed else 0)
    return identity


def _hparams_session(logger, config: dict, metrics: dict, step: int) -> None:
    """A TensorBoard HParams session: the run's values and its final metrics, without an experiment of its own (a
    run's would list all ~90 keys, and TensorBoard shows one experiment, picked arbitrarily among those there)."""
    values = {k: v if isinstance(v, bool | int | float | str) else str(v) for k, v in config.items() if v is not None}
    logger.log_metrics(metrics, step=step)
    if type(logger.experiment).__module__.startswith("tensorboardX"):  # the writer's own protobufs
        from tensorboardX.summary import hparams
    else:
        from torch.utils.tensorboard.summary import hparams
    _, start, end = hparams(values, metrics)
    writer = logger.experiment._get_file_writer()
    writer.add_summary(start)
    writer.add_summary(end)
    logger.experiment.flush()


def resync_csv(loggers: list) -> None:
    """After a fit whose ranks ran in forked or spawned processes, the main process's CSVLogger has not seen the
    columns they wrote; teach it the file's header, or the test metrics it writes next would not fit."""
    import csv

    from lightning.pytorch.loggers import CSVLogger
    from lightning.pytorch.utilities import rank_zero_only

    for logger in loggers:
        if (
            isinstance(logger, CSVLogger)
            and rank_zero_only.rank == 0
            and Path(logger.experiment.metrics_file_path).is_file()
        ):
            with open(logger.experiment.metrics_file_path, newline="") as f:
                header = next(csv.reader(f), [])
            logger.experiment.metrics_keys = sorted(set(logger.experiment.metrics_keys) | set(header))
