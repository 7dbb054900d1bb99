"""The Abstractor's tasks (docs/abstractor.md §6) and their training recipes (minattn/lab/recipes/abstractor.py)."""
import itertools

import numpy as np
import pytest

import tasks
from minattn.data import abstractor as objects  # noqa: E402


@pytest.fixture(scope="module")
def sort_task():
    return tasks.SortTask()


def _disjoint(splits):
    rows = [{tuple(r) for r in s.index.tolist()} for s in splits.values()]
    return all(not (a & b) for a, b in itertools.combinations(rows, 2))


def test_sort_objects_and_their_order(sort_task):
    objects = sort_task.objects
    assert objects.shape == (48, 12) and len(np.unique(objects, axis=0)) == 48
    a, b = objects[::12, :4], objects[:12, 4:]                 # a_i = object 12i's first 4, b_j = object j's last 8
    for i, j in itertools.product(range(4), range(12)):
        np.testing.assert_array_equal(objects[12 * i + j], np.concatenate([a[i], b[j]]))


def test_sort_splits_sequences_and_targets(sort_task):
    splits = sort_task.splits
    assert {k: len(s) for k, s in splits.items()} == {"test": 20_000, "valid": 10_000, "train": 70_000}
    assert _disjoint(splits)
    for s in splits.values():
        assert s.index.shape[1] == 10 and all(len(set(r)) == 10 for r in s.index[:500].tolist())
        np.testing.assert_array_equal(s.labels, np.argsort(s.index, axis=1))
        # the labels put the objects in increasing order: index[labels] is sorted
        assert (np.diff(np.take_along_axis(s.index, s.labels, axis=1), axis=1) > 0).all()
    assert set(np.unique(splits["train"].index)) == set(range(48))
    labels = np.array([[7, 1, 4, 5, 0, 9, 3, 8, 2, 6]])
    np.testing.assert_array_equal(tasks.SortTask.decoder_inputs(labels), [[10, 7, 1, 4, 5, 0, 9, 3, 8, 2]])
    np.testing.assert_array_equal(np.argsort([17, 3, 40, 29, 5, 11, 46, 0, 33, 21]), labels[0])  # the docstring


def test_sort_is_deterministic_and_seeded():
    a, b, c = tasks.SortTask(n_sequences=1000), tasks.SortTask(n_sequences=1000), tasks.SortTask(1, n_sequences=1000)
    np.testing.assert_array_equal(a.splits["test"].index, b.splits["test"].index)
    assert not np.array_equal(a.objects, c.objects)


def test_training_subsets(sort_task):
    pool = sort_task.splits["train"]
    sub = pool.sample(500, np.random.default_rng(0))
    assert len(sub) == 500 and len({tuple(r) for r in sub.index.tolist()}) == 500
    assert {tuple(r) for r in sub.index.tolist()} <= {tuple(r) for r in pool.index.tolist()}
    assert not np.array_equal(sub.index, pool.sample(500, np.random.default_rng(1)).index)
    for n in (0, 70_001):
        with pytest.raises(ValueError, match="train size .* out of range"):
            pool.sample(n, np.random.default_rng(0))


def test_epoch_batches_visit_every_sample_once_per_epoch():
    stream = tasks.epoch_batches(10, 4, np.random.default_rng(0))
    for _ in range(2):
        epoch = [next(stream) for _ in range(3)]
        assert [len(b) for b in epoch] == [4, 4, 2]
        assert sorted(np.concatenate(epoch).tolist()) == list(range(10))
    with pytest.raises(ValueError):
        next(tasks.epoch_batches(0, 4, np.random.default_rng(0)))


def test_pairwise_order():
    task = tasks.PairwiseOrderTask()
    assert task.objects.shape == (64, 32)
    assert {k: len(s) for k, s in task.splits.items()} == {"test": 1412, "valid": 605, "train": 2015}
    assert _disjoint(task.splits)
    index = np.concatenate([s.index for s in task.splits.values()])
    labels = np.concatenate([s.labels for s in task.splits.values()])
    assert len({tuple(r) for r in index.tolist()}) == 4032 and (index[:, 0] != index[:, 1]).all()
    np.testing.assert_array_equal(labels, index[:, 0] < index[:, 1])


def test_set_cards_and_rule():
    attrs = objects.card_attributes()
    assert attrs.shape == (81, 4) and len({tuple(a) for a in attrs.tolist()}) == 81
    np.testing.assert_array_equal(attrs[[0, 5, 40, 80]], [[0, 0, 0, 0], [0, 0, 1, 2], [1, 1, 1, 1], [2, 2, 2, 2]])
    assert tasks.is_set(attrs[[0, 40, 80]]) and not tasks.is_set(attrs[[0, 1, 5]])


def brute_force_set(values):
    """The game's definition, attribute by attribute: all equal or all different."""
    return all(len(set(column)) in (1, 3) for column in zip(*values))


@pytest.mark.parametrize("check_negatives", [True, False])
def test_set_triples_by_brute_force(check_negatives):
    task = tasks.SetTask(check_negatives=check_negatives)
    attrs = task.attributes
    assert {k: len(s) for k, s in task.splits.items()} == {"test": 2000, "valid": 1000, "train": 7000}
    index = np.concatenate([s.index for s in task.splits.values()])
    labels = np.concatenate([s.labels for s in task.splits.values()])
    assert labels.sum() == 5000 and all(len(set(r)) == 3 for r in index.tolist())
    truth = np.array([brute_force_set(attrs[r].tolist()) for r in index])
    assert truth[labels == 1].all()
    if check_negatives:
        assert not truth[labels == 0].any()
    else:
        assert 0 < truth[labels == 0].sum() < 200              # ≈ 1/79 of the 5,000 unchecked negatives
    first = index[labels == 1][:, 0]
    assert len(np.unique(first)) > 60                           # the completed card is not always last


def test_set_card_encodings():
    onehot = tasks.SetTask().objects
    np.testing.assert_array_equal(onehot.reshape(81, 4, 3).argmax(-1), objects.card_attributes())
    assert (onehot.sum(1) == 4).all()
    random64 = tasks.SetTask(cards="random64").objects
    M = np.random.default_rng(12345).standard_normal((64, 12))
    np.testing.assert_allclose(random64, np.tanh(onehot @ M.T), rtol=1e-6)
    with pytest.raises(ValueError, match="unknown card encoding"):
        tasks.SetTask(cards="images")


def test_get_task_and_cli(tmp_path, capsys):
    assert isinstance(tasks.get_task("pairwise"), tasks.PairwiseOrderTask)
    assert tasks.main(["stats", "--task", "set"]) == 0 and "7,000 samples of 3 objects" in capsys.readouterr().out
    assert tasks.main(["export", "--task", "pairwise", "--out", str(tmp_path)]) == 0
    first = (tmp_path / "train.tsv").read_text().splitlines()[0].split("\t")
    assert len(first[0].split()) == 2 and first[1] in ("0", "1")
