"""`headlab-train -m` with k-fold cross-validation and no data.cv.fold: one job per fold.

data.cv.folds comes from the command line (data.cv.folds=10) or from the named data config it chose (data=mr);
the sweep then gets data.cv.fold=range(k), so that `headlab-train -m data=mr seed=0,1,2` is the whole protocol: k
folds with each seed (a packed sweep packs each fold's seeds together).
"""

from importlib.resources import files

from omegaconf import OmegaConf


def folds_of(argv: list[str]) -> int | None:
    """The k of data.cv.folds the overrides set, directly or through one named data config; None otherwise."""
    given = dict(a.split("=", 1) for a in argv if "=" in a and not a.startswith("-"))
    if "data.cv.folds" in given:
        return int(given["data.cv.folds"]) if given["data.cv.folds"].isdigit() else None
    name = given.get("data")
    config = files("headlab.conf") / "data" / f"{name}.yaml"
    if not name or "," in name or not config.is_file():
        return None
    folds = OmegaConf.load(str(config)).get("cv", {}).get("folds")
    return folds if isinstance(folds, int) else None


def fold_sweep(argv: list[str]) -> list[str]:
    """argv with data.cv.fold=range(k) added where a multirun cross-validates and names no fold."""
    multirun = any(a in ("-m", "--multirun") for a in argv)
    if not multirun or any(a.startswith("data.cv.fold=") for a in argv) or not (k := folds_of(argv)):
        return argv
    return [*argv, f"data.cv.fold=range({k})"]
