"""The suite tests itself: a catalogue of semantic mutants (issue 31 item 5). ``make mutation`` (not in CI).

The catalogue is tests/mutants.py. Each mutant is (file, the exact original snippet, its replacement, what
it breaks). The script copies the working tree to a temporary directory once, then for each mutant: checks
that the snippet occurs exactly once in the file (an anchor that is missing or ambiguous is an ERROR, so no
mutant can silently vanish), writes the mutated file, runs the relevant tests with ``pytest -x -q`` (never
tests/lab/test_golden_runs.py), and restores the file. A mutant that no test kills is then run against
tests/lab/test_golden_runs.py alone, to count what only the 3-step snapshot catches. It prints each survivor and the
share killed without and with the golden snapshot.

    .venv/bin/python tests/mutation.py                 # the whole catalogue (291 mutants, 13 min on 2 busy cores)
    .venv/bin/python tests/mutation.py --only geometric --no-golden
    .venv/bin/python tests/mutation.py --section definitions   # that section alone (175 mutants, ~8 min)
    .venv/bin/python tests/mutation.py --section core          # engine, ops, nn, optim, fast/ (114, ~5 min)
    .venv/bin/python tests/mutation.py --list

Mutants known to be equivalent (no test can kill them: same values) are listed in its EQUIVALENT with the
reason; they are reported, not counted. The catalogue has two sections: DEFINITIONS (attention, models,
functional, the checker, data) and CORE (the textbook engine and its Accumulation, the ops/ package, nn,
optim, and the speed annex fast/). Where a rule exists twice, a fused op beside its composed form, an annex
form beside the plain one (grouped weight gradients, slice gradients, in-place/collected accumulation, the
flat optimizer buffer and its clipping), a mutant is planted in each: the annex is on under the default
environment, the plain path runs where tests ask for it (plain(), tests/library/test_plain_vs_fast.py,
tests/library/test_random_graphs.py, tests/library/test_engine.py's fused-vs-composed table), and most of the annex acts only off
NumPy, which the strict test device is.

Last full run (session 19, main at 331da79; 2 cores, other commands beside it): 290 of 290 counted mutants
killed without the golden snapshot (100%; definitions 173/173, core 117/117), so 290/290 with it too; 1
equivalent mutant (below) reported apart; 0 anchor errors; 802 s (13.4 min) wall time.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from mutants import CORE, DEFINITIONS, EQUIVALENT   # the catalogue, tests/mutants.py (beside this script)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# --- which tests each area runs (fast definition tests first: with -x a kill is usually a second) ----------
DEFS = ["tests/library/test_definitions.py"] + [f"tests/papers/{p}/test_definitions.py"
                                                for p in ("ndr", "coda", "abstractor", "compositional", "seq2attn")]
GRAD = ["tests/library/test_gradient_paths.py", "tests/library/test_gradcheck.py"]
TESTS = {
    "minattn/attention/": DEFS + ["tests/papers/ndr/test_mechanisms_and_models.py", "tests/papers/abstractor/test_mechanisms_and_models.py", "tests/papers/compositional/test_mechanism_models_and_task.py",
                                  "tests/papers/seq2attn/test_mechanism_and_models.py"] + GRAD + ["tests/papers/coda/test_mechanism_models_and_task.py", "tests/library/test_engine.py"],
    "minattn/models/": DEFS + ["tests/papers/abstractor/test_mechanisms_and_models.py", "tests/papers/seq2attn/test_mechanism_and_models.py", "tests/papers/ndr/test_mechanisms_and_models.py",
                               "tests/papers/compositional/test_mechanism_models_and_task.py"] + GRAD + ["tests/papers/coda/test_mechanism_models_and_task.py"],
    "minattn/functional.py": DEFS + ["tests/library/test_engine.py", "tests/library/test_nn_optim.py"] + GRAD + ["tests/papers/seq2attn/test_mechanism_and_models.py"],
    "minattn/gradcheck.py": ["tests/library/test_gradcheck_checker.py", "tests/library/test_gradcheck.py"],
    "minattn/data/": ["tests/papers/ndr/test_tasks.py", "tests/papers/seq2attn/test_tasks.py", "tests/papers/abstractor/test_tasks.py"],
    # the core: its own tests first, then the two paths side by side (under the default environment the
    # textbook path runs on NumPy and the annex on the strict device, and both wherever a test asks for one:
    # plain(), test_engine's fused vs composed, test_graph's two halves and test_plain_vs_fast)
    "minattn/engine.py": ["tests/library/test_engine.py", "tests/library/test_plain_env.py", "tests/library/test_gradient_paths.py",
                          "tests/library/test_random_graphs.py"] + DEFS +
                          ["tests/library/test_gradcheck.py", "tests/library/test_nn_optim.py", "tests/library/test_plain_vs_fast.py"],
    "minattn/ops/": ["tests/library/test_gradient_paths.py", "tests/library/test_engine.py"] + DEFS +
                    ["tests/library/test_gradcheck.py", "tests/library/test_random_graphs.py", "tests/papers/coda/test_mechanism_models_and_task.py", "tests/library/test_plain_vs_fast.py"],
    "minattn/nn.py": DEFS + ["tests/library/test_nn_optim.py", "tests/library/test_engine.py"] + GRAD + ["tests/library/test_plain_vs_fast.py"],
    "minattn/optim.py": ["tests/library/test_nn_optim.py", "tests/library/test_launches.py", "tests/lab/test_train.py",
                         "tests/library/test_plain_vs_fast.py"],
    # the annex: most of it acts off NumPy only, which the strict device of minattn/tools/strict.py is
    "minattn/fast/flat.py": ["tests/library/test_launches.py", "tests/library/test_nn_optim.py", "tests/lab/test_train.py",
                             "tests/library/test_plain_vs_fast.py"],   # its own tests (strict device) come first
    # (value tests first, then test_launches, whose launch budgets also fail when a mutant adds or drops an
    # array operation, and its flat-buffer tests)
    "minattn/fast/": ["tests/library/test_engine.py", "tests/library/test_gradient_paths.py", "tests/library/test_random_graphs.py",
                      "tests/library/test_nn_optim.py"] + DEFS + ["tests/library/test_gradcheck.py", "tests/library/test_launches.py",
                                                          "tests/library/test_plain_vs_fast.py", "tests/lab/test_train.py"],
    "tests/": ["tests/lab/test_golden_update.py"],
}


def tests_for(path):
    return next(v for k, v in TESTS.items() if path.startswith(k))



def copy_tree(dst):
    """The working tree (tracked and untracked, not ignored files) into dst."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for f in filter(None, files):
        src = os.path.join(ROOT, f)
        if os.path.isfile(src):
            os.makedirs(os.path.dirname(os.path.join(dst, f)), exist_ok=True)
            shutil.copy2(src, os.path.join(dst, f))


def run_tests(tree, tests, timeout):
    env = dict(os.environ, PYTHONPATH=tree, MINATTN_REQUIRE_GPU="0", OPENBLAS_NUM_THREADS="1",
               PYTHONDONTWRITEBYTECODE="1")
    env.pop("MINATTN_UPDATE_GOLDEN", None)
    env.pop("MINATTN_REGEN_GOLDEN", None)
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "not slow and not gpu",
           "--ignore=tests/lab/test_golden_runs.py"] + tests
    try:
        r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", ""
    out = r.stdout.decode(errors="replace")
    failed = [line for line in out.splitlines() if line.startswith(("FAILED", "ERROR"))]
    if r.returncode == 0:
        return "survived", ""
    if r.returncode == 1:
        return "killed", failed[0] if failed else ""
    return "error", out[-2000:] + r.stderr.decode(errors="replace")[-2000:]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="mutants whose file or description contains this text")
    ap.add_argument("--section", choices=["definitions", "core", "all"], default="all")
    ap.add_argument("--no-golden", action="store_true", help="skip the golden-snapshot pass over survivors")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per mutant run")
    args = ap.parse_args(argv)
    catalogue = ([("definitions", m) for m in DEFINITIONS] if args.section != "core" else []) + \
                ([("core", m) for m in CORE] if args.section != "definitions" else [])
    if args.only:
        catalogue = [(s, m) for s, m in catalogue if args.only in m.file or args.only in m.description]
    if args.list:
        for s, m in catalogue:
            print(f"[{s}] {m.file}: {m.description}")
        return 0
    start = time.time()
    results, errors = [], []
    with tempfile.TemporaryDirectory(prefix="minattn-mutation-") as tree:
        copy_tree(tree)
        # the copy, not the editable install, must be what the tests import
        where = subprocess.run([sys.executable, "-c", "import minattn; print(minattn.__file__)"], cwd=tree,
                               env=dict(os.environ, PYTHONPATH=tree), capture_output=True, text=True).stdout.strip()
        if not where.startswith(tree):
            print(f"ERROR: the copy imports minattn from {where}, not from {tree}")
            return 2
        baseline = {}
        for i, (section, m) in enumerate(catalogue, 1):
            path = os.path.join(tree, m.file)
            with open(path, encoding="utf-8") as f:
                original = f.read()
            n = original.count(m.original)
            if n != 1:
                errors.append((m, f"anchor found {n} times"))
                print(f"[{i}/{len(catalogue)}] ERROR {m.file}: {m.description}: anchor found {n} times")
                continue
            tests = tests_for(m.file)
            key = tuple(tests)
            if key not in baseline:                      # the unmutated tree must pass these tests
                baseline[key] = run_tests(tree, tests, args.timeout)[0]
                if baseline[key] != "survived":
                    print(f"ERROR: the unmutated tree fails {' '.join(tests)}")
                    return 2
            with open(path, "w", encoding="utf-8") as f:
                f.write(original.replace(m.original, m.replacement))
            try:
                t0 = time.time()
                status, detail = run_tests(tree, tests, args.timeout)
                golden = None
                if status == "survived" and not args.no_golden:
                    golden = _golden(tree, args.timeout)
            finally:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(original)
            results.append((section, m, status, golden))
            note = f" (golden: {golden})" if golden else ""
            print(f"[{i}/{len(catalogue)}] {status:8s} {time.time() - t0:5.1f}s {m.file}: {m.description}{note}"
                  + (f"  <- {detail}" if status == "killed" and detail else "")
                  + (f"\n{detail}" if status == "error" else ""), flush=True)
    counted = [r for r in results if r[1].description not in EQUIVALENT]
    killed = [r for r in counted if r[2] in ("killed", "timeout", "error")]
    by_golden = [r for r in counted if r[2] == "survived" and r[3] == "killed"]
    survivors = [r for r in counted if r[2] == "survived"]
    print("\n=== mutation score ===")
    for section in ("definitions", "core"):
        sec = [r for r in counted if r[0] == section]
        if sec:
            k = sum(r[2] != "survived" for r in sec)
            print(f"{section:12s}: {k}/{len(sec)} killed without the golden snapshot ({100 * k / len(sec):.1f}%)")
    if counted:
        print(f"all         : {len(killed)}/{len(counted)} killed without the golden snapshot "
              f"({100 * len(killed) / len(counted):.1f}%)")
        if not args.no_golden:
            k2 = len(killed) + len(by_golden)
            print(f"all         : {k2}/{len(counted)} killed with it ({100 * k2 / len(counted):.1f}%)")
    for r in survivors:
        print(f"SURVIVED: {r[1].file}: {r[1].description}" + (f" (golden: {r[3]})" if r[3] else ""))
    for r in results:
        if r[1].description in EQUIVALENT:
            print(f"equivalent ({r[2]}): {r[1].description}: {EQUIVALENT[r[1].description]}")
    for m, why in errors:
        print(f"ERROR (anchor): {m.file}: {m.description}: {why}")
    print(f"{len(results)} mutants run in {time.time() - start:.0f} s; {len(errors)} anchor errors")
    return 1 if errors else 0


def _golden(tree, timeout):
    env = dict(os.environ, PYTHONPATH=tree, OPENBLAS_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    env.pop("MINATTN_UPDATE_GOLDEN", None)
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "tests/lab/test_golden_runs.py"]
    try:
        r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout"
    return "survived" if r.returncode == 0 else "killed"


if __name__ == "__main__":
    sys.exit(main())
