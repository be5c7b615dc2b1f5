"""A sweep's run records in one file: every run's results.json, heads.json, metrics.csv and .hydra/ config, as a
.tar.xz of a few hundred KB, without checkpoints, figures or logger files.

headlab-compare reads such an archive as it reads the sweep directory (so a table recomputes from the archive
committed beside it), and `tar -xJf ARCHIVE -C DIR` puts the records back where `sweep.resume=true` finds them
(completed runs are skipped, the others run).
"""

import tarfile
from pathlib import Path

RECORDS = ("results.json", "heads.json", "metrics.csv", ".hydra/config.yaml", ".hydra/overrides.yaml")
SUFFIXES = (".tar.xz", ".tar.gz", ".tar")


def is_archive(path: Path) -> bool:
    return path.name.endswith(SUFFIXES) and path.is_file()


def write(path: Path, roots: list[Path]) -> int:
    """Archive the records of every run below the roots (directories holding results.json somewhere below them),
    each under its root's own name (sweep/3/results.json); returns the number of runs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    runs = 0
    mode = {".xz": "w:xz", ".gz": "w:gz"}.get(path.suffix, "w")
    partial = path.with_name(path.name + ".partial")
    with tarfile.open(partial, mode) as tar:
        for root in roots:
            for results in sorted(root.rglob("results.json")):
                runs += 1
                for name in RECORDS:
                    file = results.parent / name
                    if file.is_file():
                        tar.add(file, arcname=str(file.relative_to(root.parent)), recursive=False)
    partial.replace(path)
    return runs


def read(path: Path) -> dict[str, dict[str, str]]:
    """{run (ARCHIVE:sweep/3): {record name (results.json, heads.json, ...): its text}} of every run archived."""
    runs: dict[str, dict[str, str]] = {}
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            name = next((r for r in RECORDS if member.name.endswith("/" + r)), None)
            if name is None:
                continue
            run = member.name[: -len(name) - 1]
            runs.setdefault(f"{path}:{run}", {})[name] = tar.extractfile(member).read().decode("utf-8")
    return runs
