"""headlab-train: the Hydra entry point (`python -m headlab.train` is the same).

The composed config is validated before torch, Lightning or the data are imported, so a wrong value is
reported in one line at once. Every run ends with results.json in its run directory, also when it fails.
"""

import logging
import os
import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from headlab.config_check import ConfigError, check_config
from headlab.results import flat_config, git_sha, versions, write_json_atomic

log = logging.getLogger("headlab")


@hydra.main(version_base="1.3", config_path="pkg://headlab.conf", config_name="train")
def main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    started = time.time()
    record = {
        "status": "running",
        "config": flat_config(cfg, dict(hydra_cfg.runtime.choices)),
        "seed": cfg.seed,
        "git_sha": git_sha(),
        "versions": versions(),
        "wandb": {"id": None, "url": None},
    }
    try:
        check_config(cfg)
        from headlab.training import train  # the heavy imports, only once the config is known to be valid

        record.update(train(cfg, record["config"]), status="completed")
    except ConfigError as error:
        _finish(run_dir, record, started, error)
        print(f"headlab-train: invalid config: {error}", file=sys.stderr)
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        sys.exit(2)
    except BaseException as error:
        _finish(run_dir, record, started, error)
        raise
    _finish(run_dir, record, started)
    log.info("results: %s", run_dir / "results.json")


def _finish(run_dir: Path, record: dict, started: float, error: BaseException | None = None) -> None:
    if error is not None:
        record.update(status="failed", error=f"{type(error).__name__}: {error}")
    record["duration_s"] = round(time.time() - started, 3)
    write_json_atomic(run_dir / "results.json", record)


if __name__ == "__main__":
    main()
