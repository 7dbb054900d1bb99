"""The task catalogue and its command line: every task minattn trains on, what it asks, where it lives.

    python tasks.py stats  --task ctl                  # split sizes, lengths, depth histograms
    python tasks.py export --task ctl --out DIR        # every split as text, one example per line
    python tasks.py export --task scan --split all --out DIR   # every SCAN command
    python tasks.py stats  --task arith --set n_train=1000     # a task's own options (sizes, searches, ...)

| task | paper | what a sample asks | generator |
|---|---|---|---|
| ctl, ctl-backward | Neural Data Router | compose 3-bit lookup tables, argument first (or last) | minattn/data/ndr.py |
| arith | Neural Data Router | evaluate a bracketed + and * expression mod 10 | minattn/data/ndr.py |
| listops | Neural Data Router | evaluate nested MIN/MAX/MED/SM lists | minattn/data/listops.py |
| lookup | seq2attn | apply lookup tables and write every intermediate result | minattn/data/seq2seq.py |
| scan | seq2attn | translate a SCAN command into actions (one split at a time) | minattn/data/seq2seq.py |
| retrieval | Compositional Attention | per search, a feature of each object's nearest neighbour | minattn/data/retrieval.py |
| sort, pairwise, set | Abstractor | sort objects; order a pair; is a triple of cards a SET | minattn/data/objects.py |
| mlu | CoDA | x=85,y=-523,x*y → -44455, character by character | minattn/data/mlu.py |

The generators live in the package (``minattn.data``) behind one interface, described in its
docstring: ``task.splits``, ``len(split)``, ``split.lines``, ``split.describe()``. The names below
are re-exported for train.py and the tests. Generated token-classification data is cached under
``$MINATTN_CACHE`` (default ~/.cache/minattn); the other tasks are generated in about a second.
"""
import argparse
import os
import sys

# The names train.py reads as tasks.<name>, re-exported (tests/test_layout.py keeps this list complete).
from minattn.data import (SCAN_SPLITS, TASKS, MLUTask, PairwiseOrderTask, Ragged, RetrievalTask,  # noqa: F401
                          Seq2SeqSplit, SetTask, SortTask, batches, collate, epoch_batches, eval_batches,
                          get_task, is_set, scan_split)
from minattn.data.seq2seq import scan_commands, scan_line


def _option(text: str):
    """--set KEY=VALUE: an int when it reads as one, else the string."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, int(value) if value.lstrip("-").isdigit() else value


def _files(args) -> dict:
    """{file name: lines} of the task the command line names (``--split all``: every SCAN command)."""
    options = dict(args.set)
    if args.split:
        if args.task != "scan":
            raise ValueError(f"--split is for scan only ({args.task} has one split structure): drop --split")
        if args.split == "all":
            return {"all.txt": [scan_line(p) for p in scan_commands()]}
        options["split"] = args.split
    task = get_task(args.task, seed=args.seed, cache_dir=args.cache_dir, **options)
    if args.command == "stats":
        print(task)
        width = max(6, *(len(k) for k in task.splits))
        for k, s in task.splits.items():
            print(f"{k:>{width}}: {len(s):>9,} {s.describe()}")
        return {}
    return task.export_files()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Generate, inspect and export the minattn tasks.")
    sub = parser.add_subparsers(dest="command", required=True)
    for cmd, text in [("export", "write every split of a task as text, one example per line"),
                      ("stats", "print split sizes, lengths and depths")]:
        p = sub.add_parser(cmd, help=text)
        p.add_argument("--task", required=True, help=f"one of: {', '.join(TASKS)}")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--cache-dir", default=None)
        p.add_argument("--split", default="", help="scan only: the split (see SCAN_SPLITS), or 'all' to export "
                       "every command")
        p.add_argument("--set", type=_option, action="append", default=[], metavar="KEY=VALUE",
                       help="a task option, e.g. n_train=1000 (arith, listops, mlu), searches=3 (retrieval)")
        if cmd == "export":
            p.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        files = _files(args)
        if args.command == "export":
            os.makedirs(args.out, exist_ok=True)
            for name, lines in files.items():
                with open(os.path.join(args.out, name), "w") as f:
                    f.writelines(line + "\n" for line in lines)
            print(f"wrote {', '.join(files)} to {args.out}")
    except (TypeError, ValueError, OSError) as e:
        print(f"tasks.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
