"""Embedded tasks: ListOps against the released test split, associative recall against its definition."""

import gc
import itertools
import multiprocessing

import numpy as np
import pytest
import torch

from conftest import ROOT
from headlab.conventions import IGNORE_INDEX as IGNORE
from headlab.data.datamodule import TaskDataModule, collate
from headlab.data.listops import OPERATORS, VOCAB, ListOps, evaluate, evaluate_string, to_string, tokens
from headlab.data.recall import AssociativeRecall

LISTOPS_TEST = ROOT / ".." / "shared" / "data" / "listops" / "test_d20s.tsv"


@pytest.mark.skipif(not LISTOPS_TEST.exists(), reason="../shared/data is absent")
def test_listops_evaluator_reproduces_all_released_test_labels():
    rows = [line.rstrip("\n").split("\t") for line in LISTOPS_TEST.open()]
    assert len(rows) == 10_000
    wrong = [(label, expr) for label, expr in rows if evaluate_string(expr) != int(label)]
    assert wrong == []


def test_listops_generator_writes_the_released_format_and_respects_caps():
    task = ListOps(max_depth=4, max_length=40)
    rng = np.random.default_rng(0)
    for _ in range(300):
        tree = task.tree(rng)
        assert tree[0] in OPERATORS  # the root is always an operator
        text = to_string(tree)
        assert text.startswith("( ") and text.endswith(" ] )")
        assert evaluate_string(text) == evaluate(tree) == evaluate_string(" ".join(tokens(tree)))
    for ids, label in task.sample(rng, 300):
        expr = " ".join(VOCAB[i] for i in ids)
        assert len(ids) <= 40 and evaluate_string(expr) == label
        depth = max(np.cumsum([1 if VOCAB[i] in OPERATORS else -1 if VOCAB[i] == "]" else 0 for i in ids]))
        assert depth <= 3  # max_depth counts the leaves' level


def test_listops_median_truncates_like_numpy():
    assert evaluate_string("[MED 2 5 ]") == int(np.median([2, 5])) == 3
    assert evaluate_string("[SM 9 9 5 ]") == 3


def test_listops_rejects_malformed_expressions():
    with pytest.raises(ValueError, match="malformed ListOps expression"):
        evaluate_string("[MAX 1 2")


def _decode_recall(task, ids, labels):
    """Recompute the labels from the tokens alone, with the vocabulary layout documented in recall.py."""
    K, V = task.n_keys, task.n_values
    context = ids[: task.n_pairs]
    value_of = {int(k): int(v) - 1 - K for k, v in context}
    expected = []
    for first, second in ids[task.n_pairs :]:
        if task.lookups == 1:
            expected.append(value_of[int(first)])
        else:
            expected.append(value_of[int(first)] - value_of[int(second) - K - V] + V - 1)
    return expected, labels[task.n_pairs :]


@pytest.mark.parametrize("lookups", [1, 2])
def test_fused_recall_labels_are_the_values_of_the_named_keys(lookups):
    task = AssociativeRecall(n_keys=20, n_values=6, n_pairs=8, n_queries=5, lookups=lookups, fused=True)
    for ids, labels in task.sample(np.random.default_rng(1), 50):
        assert ids.shape == (13, 2) and ids.max() < task.vocab_size
        assert len(set(ids[:8, 0])) == 8  # distinct keys per example
        expected, got = _decode_recall(task, ids, labels)
        assert list(got) == expected and all(labels[:8] == IGNORE)
        assert all(0 <= y < task.n_classes for y in got)


def test_token_level_mqar_alternates_keys_and_values():
    task = AssociativeRecall(n_keys=30, n_values=30, n_pairs=6, n_queries=4, lookups=1, fused=False)
    ids, labels = task.sample(np.random.default_rng(2), 1)[0]
    assert ids.shape == (16,) and task.max_len == 16
    value_of = dict(zip(ids[0:12:2].tolist(), (ids[1:12:2] - 1 - 30).tolist(), strict=True))
    assert labels[12:].tolist() == [value_of[k] for k in ids[12:].tolist()]
    assert (labels[:12] == IGNORE).all()


def test_collate_pads_to_the_longest_sequence_of_the_batch():
    batch = collate([(np.array([3, 4, 5]), 1), (np.array([6]), 0)])
    assert batch["tokens"].tolist() == [[3, 4, 5], [6, 0, 0]]
    assert batch["padding_mask"].tolist() == [[False, False, False], [False, True, True]]
    assert batch["labels"].tolist() == [1, 0]
    token_level = collate([(np.array([3, 4]), np.array([1, 2])), (np.array([6]), np.array([0]))])
    assert token_level["labels"].tolist() == [[1, 2], [0, IGNORE]]
    fused = [(np.arange(6).reshape(3, 2) + i, np.array([i, IGNORE, i])) for i in range(4)]  # one shape: stacked
    same = collate(fused)
    assert same["tokens"].shape == (4, 3, 2) and not same["padding_mask"].any()
    assert same["tokens"][3].tolist() == [[3, 4], [5, 6], [7, 8]] and same["labels"][2].tolist() == [2, IGNORE, 2]


def test_datamodule_splits_are_seeded_and_disjoint_streams():
    def make(seed):
        dm = TaskDataModule(ListOps(), n_train=50, n_val=20, n_test=20, batch_size=8, seed=seed)
        dm.setup()
        return dm

    a, b, c = make(0), make(0), make(1)
    first = next(iter(a.val_dataloader()))
    assert torch.equal(first["tokens"], next(iter(b.val_dataloader()))["tokens"])
    assert not torch.equal(first["tokens"], next(iter(c.val_dataloader()))["tokens"])
    train_exprs = {tuple(t) for t, _ in a.splits["train"]}
    assert len(train_exprs) > 1 and a.splits["val"][0][0].tolist() != a.splits["train"][0][0].tolist()


def test_a_loader_with_workers_nobody_holds_ends_its_workers_at_once():
    """As the head analysis drops the loader it read a few batches from: freed at once (it is in no reference
    cycle), its persistent workers shut down there, not at a later garbage collection, which closes their queues
    first and leaves each worker to a 5 s timeout (20 s at the end of every run with data.num_workers=2)."""
    dm = TaskDataModule(ListOps(), n_train=50, n_val=40, n_test=20, batch_size=8, num_workers=2, seed=0)
    dm.setup()
    before = set(multiprocessing.active_children())  # an earlier test's, in this process
    gc.disable()  # a loader in a cycle would keep its workers until a collection
    try:
        batches = list(itertools.islice(dm.ordered_dataloader("val"), 2))
        assert len(batches) == 2 and set(multiprocessing.active_children()) <= before
    finally:
        gc.enable()


@pytest.mark.parametrize("fused", [True, False])  # (n, 2) tokens with per-position labels; (n,) tokens
def test_a_splits_digest_hashes_each_examples_ids_labels_and_a_bar_in_order(fused):
    """The digest a resumed or reloaded run compares: sha256 over every example's int64 token ids, int64 labels and
    b"|", example by example, written here naively; equal-shaped splits are hashed at once, ragged ones in turn."""
    import hashlib

    from headlab.data.datamodule import split_digest

    def naive(examples):
        digest = hashlib.sha256()
        for ids, label in examples:
            digest.update(np.asarray(ids, dtype=np.int64).tobytes() + np.asarray(label, dtype=np.int64).tobytes())
            digest.update(b"|")
        return digest.hexdigest()

    task = AssociativeRecall(n_keys=8, n_values=4, n_pairs=4, n_queries=4, lookups=2 if fused else 1, fused=fused)
    generated = task.sample(np.random.default_rng(0), 50)
    ragged = [(np.arange(1, 2 + i % 7, dtype=np.int32), i % 3) for i in range(20)]  # text: lengths vary, one label
    for examples in (generated, ragged, [(t, int(y[y != IGNORE][0])) for t, y in generated], []):
        assert split_digest(examples) == naive(examples)
    assert split_digest(generated) != split_digest(generated[::-1])
