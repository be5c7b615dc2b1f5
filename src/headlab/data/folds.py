"""k-fold cross-validation for data without a test split: stratified folds fixed by a seed of their own.

Within each class (in sorted order) a seeded permutation of its examples is dealt round-robin to the folds,
continuing where the previous class stopped: every example is in exactly one fold, each fold holds each class's
share up to one example, and the folds' sizes differ by at most one. The same labels, k and seed give the same
folds on any machine (numpy's PCG64 stream for the seed).
"""

import numpy as np

from headlab.data.text_pipeline import read_column
from headlab.errors import DataError


def stratified_folds(labels, k: int, seed: int) -> np.ndarray:
    """The fold (0..k-1) of each example. labels: (n,) class of each example."""
    labels = np.asarray(labels)
    if not 2 <= k <= len(labels):
        raise DataError(f"data.cv.folds={k} is invalid: expected 2..{len(labels)} (the training split's rows)")
    rng = np.random.default_rng([seed, 23])
    folds = np.empty(len(labels), dtype=np.int64)
    dealt = 0
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        folds[members] = (dealt + np.arange(len(members))) % k
        dealt += len(members)
    return folds


def split_fold(data: dict, label_column: str, k: int, fold: int, seed: int) -> dict:
    """The training data as cross-validation fold `fold` of k: its examples are the test split, the others train
    (data: role -> Dataset; a validation split given is kept)."""
    train = data["train"]
    folds = stratified_folds([str(y) for y in read_column(train, label_column)], k, seed)
    return {
        **data,
        "train": train.select(np.flatnonzero(folds != fold).tolist()),
        "test": train.select(np.flatnonzero(folds == fold).tolist()),
    }
