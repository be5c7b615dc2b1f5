"""A run's test predictions, kept in its results.json ("predictions") so that arms can be compared example by
example: the class predicted for each scored test example (or position, for a token task) in the test split's
order, and whether it was right, each base64-encoded (classes as uint8 or uint16, correctness as packed bits: a
few KB for a few thousand examples). The test split's digest (results.json data.digests.splits.test) says which
examples they are: runs pair only on the same test split.
"""

import base64

import numpy as np


def encode(classes: np.ndarray, correct: np.ndarray) -> dict:
    """classes (N,) ints, correct (N,) bools -> the record's "predictions" field."""
    dtype = np.uint8 if classes.size == 0 or classes.max() < 256 else np.uint16
    return {
        "split": "test",
        "n": int(classes.size),
        "dtype": np.dtype(dtype).name,
        "classes": base64.b64encode(classes.astype(dtype).tobytes()).decode(),
        "correct": base64.b64encode(np.packbits(correct.astype(bool)).tobytes()).decode(),
    }


def decode(field: dict) -> tuple[np.ndarray, np.ndarray]:
    """The record's "predictions" field -> (classes (N,), correct (N,) bool)."""
    n = field["n"]
    classes = np.frombuffer(base64.b64decode(field["classes"]), dtype=field["dtype"])[:n].astype(np.int64)
    correct = np.unpackbits(np.frombuffer(base64.b64decode(field["correct"]), dtype=np.uint8))[:n].astype(bool)
    return classes, correct


def correctness(record: dict) -> np.ndarray | None:
    """(N,) bool: which test examples the run got right, or None where it kept no predictions."""
    field = record.get("predictions")
    return decode(field)[1] if field else None
