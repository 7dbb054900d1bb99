"""The tasks: data generators of every paper, behind one interface, in one registry (``TASKS``).

Every task is generated in code from a seed (no downloads) and holds fixed data:

    task = get_task("ctl", seed=0)        # or TASKS["ctl"](seed=0, **sizes)
    task.name                             the --task name (names as in the papers)
    task.splits                           {split name: split}, e.g. train, iid, valid, test
    len(split)                            its number of examples
    split.lines                           its examples as text, one line each (``tasks.py export``)
    split.describe()                      a one-line summary after the size (``tasks.py stats``)
    task.export_files()                   {file name: lines}: a file per split (+ objects.tsv: objects)

Training batches come in one shape: ``batches(batch_size, rng, ...)``, an endless generator of host
batches that is a pure function of ``rng``, on what holds the training data. On top of that, each
kind of task carries what its models read; the recipes (minattn/lab/recipes/) use these directly:

    kind (module)            tasks               a split holds              batches from
    token classification     ctl, ctl-backward,  inputs (Ragged), labels,   split.batches(B, rng, mode)
      (ndr, listops)         arith, listops      depths; task.vocab         (eval: eval_batches(split, B))
    sequence to sequence     lookup, scan, mlu   inputs, targets (Ragged),  split.batches(B, rng, mode)
      (seq2attn, coda)                           lines; in/out_vocab        (eval: split.eval_batches(B))
    objects (abstractor)     sort, pairwise, set index, labels;             split.batches(B, rng)
                                                 task.objects               (Keras-style epochs)
    retrieval                retrieval           a seeded sample per pool   task.batches(B, rng, pool)
      (compositional)

``retrieval`` has no fixed data (each training step draws a fresh batch), so its splits are seeded
samples of its three pools made only when read. Nothing in this package imports tasks.py or
train.py.
"""
from .base import Ragged, Task
from .classification import ClassificationSplit, ClassificationTask, batches, collate, eval_batches
from .listops import ListOpsTask
from .coda import MLUTask
from .ndr import ArithTask, CTLBackwardTask, CTLTask
from .abstractor import ObjectSplit, PairwiseOrderTask, SetTask, SortTask, epoch_batches, is_set
from .compositional import RetrievalTask
from .seq2attn import SCAN_SPLITS, LookupTask, ScanTask, Seq2SeqSplit, scan_split

__all__ = ["TASKS", "get_task", "Task", "Ragged",
           # token classification
           "ClassificationSplit", "ClassificationTask", "batches", "collate", "eval_batches",
           "CTLTask", "CTLBackwardTask", "ArithTask", "ListOpsTask",
           # sequence to sequence
           "Seq2SeqSplit", "LookupTask", "ScanTask", "SCAN_SPLITS", "scan_split", "MLUTask",
           "ObjectSplit", "SortTask", "PairwiseOrderTask", "SetTask", "epoch_batches", "is_set",  # objects
           "RetrievalTask"]

TASKS = {"ctl": CTLTask, "ctl-backward": CTLBackwardTask, "arith": ArithTask,
         "listops": ListOpsTask,
         "lookup": LookupTask, "scan": ScanTask, "retrieval": RetrievalTask,
         "sort": SortTask, "pairwise": PairwiseOrderTask, "set": SetTask, "mlu": MLUTask}


def get_task(name: str, seed: int = 0, cache_dir=None, **options) -> Task:
    """The task called name (see TASKS), generated from seed (or loaded from the disk cache).

    options: the task's own settings, e.g. n_train=... for quick tests (the defaults are the papers'
    sizes), split=... for scan, searches=... for retrieval.
    """
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r} (valid: {', '.join(TASKS)})")
    return TASKS[name](seed=seed, cache_dir=cache_dir, **options)
