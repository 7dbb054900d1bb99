"""The task catalogue and its command line: every task minattn trains on, what it asks, where it lives.

    python tasks.py stats  --task ctl                  # split sizes, lengths, depth histograms
    python tasks.py export --task ctl --out DIR        # every split as text, one example per line
    python tasks.py export --task scan --split all --out DIR   # every SCAN command
    python tasks.py stats  --task arith --set n_train=1000     # a task's own options (sizes, searches, ...)

| task | what a sample asks | generator (minattn/data/) | design note |
|---|---|---|---|
| ctl, ctl-backward | compose 3-bit lookup tables, argument first (or last) | ndr.py | docs/ndr.md §7.1 |
| arith | evaluate a bracketed + and * expression mod 10 | ndr.py | docs/ndr.md §7.2 |
| listops | evaluate nested MIN/MAX/MED/SM lists | listops.py | docs/ndr.md §7.3 |
| lookup | apply lookup tables, writing every intermediate result | seq2attn.py | docs/seq2attn.md §2 |
| scan | translate a SCAN command into actions (one split at a time) | seq2attn.py | docs/seq2attn.md §3 |
| retrieval | per search, a feature of the nearest neighbour | compositional.py | docs/compositional.md §7 |
| sort, pairwise, set | sort objects, order a pair, spot a SET | abstractor.py | docs/abstractor.md §6 |
| mlu | x=85,y=-523,x*y → -44455, character by character | coda.py | docs/coda.md §5 |

The generators live in the package (``minattn.data``) behind one interface, described in its docstring:
``task.splits``, ``len(split)``, ``split.lines``, ``split.describe()``. The names below are re-exported for
scripts and the tests (train.py reaches the data through its recipes, minattn/lab/recipes/). Generated
token-classification data is cached under ``$MINATTN_CACHE`` (default ~/.cache/minattn); the other tasks are
generated in about a second.
"""
import argparse
import inspect
import math
import os
import sys

# Re-exported: the tests and scripts read them as tasks.<name>; their home is minattn.data.
from minattn.data import (SCAN_SPLITS, TASKS, MLUTask, PairwiseOrderTask, Ragged, RetrievalTask,  # noqa: F401
                          SetTask, SortTask, batches, collate, epoch_batches, eval_batches, get_task, is_set,
                          scan_split)
from minattn.data.seq2attn import ScanGrammar


def _option(text: str):
    """--set KEY=VALUE: the pair, typed later by the task's option (``_typed``)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


MAX_COUNT = 10_000_000   # ten times the largest split a paper draws (ListOps' 1,000,000 training examples)


def _typed(key, text, default):
    """--set KEY=TEXT as the type of the option's default. A count must be ≥ 1 (a size of -1 or a max_length
    of 0 is no task: its generator would never end) and at most MAX_COUNT (a trillion examples would be
    drawn for days without a line of output), a number finite and ≥ 0."""
    kind = type(default)
    if kind is bool:
        if text.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"--set {key}={text}: expected true or false")
        return text.lower() in ("true", "1")
    if kind not in (int, float):
        return text
    try:
        value = kind(text)
    except ValueError:
        expected = "an integer" if kind is int else "a number"
        raise ValueError(f"--set {key}={text}: expected {expected}") from None
    if kind is int and not 1 <= value <= MAX_COUNT:
        raise ValueError(f"--set {key}={text}: expected an integer from 1 to {MAX_COUNT:,}")
    if kind is float and not 0 <= value < math.inf:
        raise ValueError(f"--set {key}={text}: expected a finite number ≥ 0")
    return value


def _task(args):
    """The task the command line names; ``scan --split all`` is every SCAN command as one split."""
    options = dict(args.set)
    if args.split:
        if args.task != "scan":
            raise ValueError(f"--split is for scan only ({args.task} has one split structure): drop --split")
        if args.split == "all":
            return ScanGrammar()
        options["split"] = args.split
    if args.task in TASKS:   # name a mistyped option and the valid ones, not the constructor's TypeError
        defaults = {k: p.default for k, p in inspect.signature(TASKS[args.task].__init__).parameters.items()
                    if k not in ("self", "seed", "cache_dir", "split")}
        unknown = [k for k in options if k not in defaults and k != "split"]
        if unknown:
            raise ValueError(f"{args.task} has no option {', '.join(map(repr, unknown))} for --set; valid: "
                             f"{', '.join(defaults) or 'none'}")
        options.update({k: _typed(k, v, defaults[k]) for k, v in options.items() if k in defaults})
    return get_task(args.task, seed=args.seed, cache_dir=args.cache_dir, **options)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for cmd, text in [("export", "write every split of a task as text, one example per line"),
                      ("stats", "print split sizes, lengths and depths")]:
        p = sub.add_parser(cmd, help=text)
        p.add_argument("--task", required=True, help=f"one of: {', '.join(TASKS)}")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--cache-dir", default=None)
        p.add_argument("--split", default="", help="scan only: the split (see SCAN_SPLITS), or 'all' to "
                                                   "export "
                       "every command")
        p.add_argument("--set", type=_option, action="append", default=[], metavar="KEY=VALUE",
                       help="a task option, e.g. n_train=1000 (arith, listops, mlu), searches=3 (retrieval)")
        if cmd == "export":
            p.add_argument("--out", required=True)
            p.add_argument("--force", action="store_true", help="replace files of the same names in --out")
    args = parser.parse_args(argv)
    try:
        task = _task(args)
        if args.command == "stats":
            print(task)
            width = max(6, *(len(k) for k in task.splits))
            for k, s in task.splits.items():
                print(f"{k:>{width}}: {len(s):>9,} {s.describe()}")
            return 0
        files = task.export_files()
        there = [name for name in files if os.path.lexists(os.path.join(args.out, name))]
        if there and not args.force:   # refused before anything is written: nothing of the user's is lost
            print(f"tasks.py: error: {args.out} already holds {', '.join(there)}; nothing was written "
                  "(choose another --out, or add --force to replace them)", file=sys.stderr)
            return 2
        os.makedirs(args.out, exist_ok=True)
        for name, lines in files.items():
            # --force replaces a link, never writes through it
            if os.path.islink(os.path.join(args.out, name)):
                os.unlink(os.path.join(args.out, name))
            with open(os.path.join(args.out, name), "w") as f:
                f.writelines(line + "\n" for line in lines)
        print(f"wrote {', '.join(files)} to {args.out}")
    except BrokenPipeError:   # `tasks.py stats ... | head`: the reader left, handled below
        raise
    except (TypeError, ValueError, OSError) as e:
        print(f"tasks.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:   # not an error of ours (as in train.py)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
