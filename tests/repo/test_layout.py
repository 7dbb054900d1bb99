"""The house's layout: imports go one way (nothing in minattn/ imports the top-level tasks.py or train.py;
the library never imports its two other wings, minattn/lab/ and minattn/tools/; the core never imports the
speed annex minattn/fast/, and the annex imports only the core, but for its one named file; rundir.py not
the recipes), and the budgets: train.py's lines, Tensor.backward's lines, every source file's, and the
width of source lines."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _imported_modules(path):
    """Every module a file imports, relative imports resolved (``from ..lab import viz`` in
    minattn/attention/x.py is minattn.lab and minattn.lab.viz)."""
    package = os.path.relpath(path, ROOT).split(os.sep)[:-1]
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] + [node.module or ""] if node.level
                            else [node.module]).strip(".")
            yield base
            yield from (f"{base}.{a.name}" for a in node.names)


def test_nothing_in_the_package_imports_the_top_level_scripts():
    offenders = []
    for folder, _, files in os.walk(os.path.join(ROOT, "minattn")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                offenders += [f"{os.path.relpath(path, ROOT)} imports {m}" for m in _imported_modules(path)
                              if m.split(".")[0] in ("tasks", "train")]
    assert not offenders, offenders


TRAIN_PY_BUDGET = 300   # lines: train.py is the loop (restore → loop → finish); the command line is minattn/lab/cli.py


def test_train_py_stays_the_loop():
    with open(os.path.join(ROOT, "train.py"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    n = len(lines)
    assert n <= TRAIN_PY_BUDGET, (f"train.py has {n} lines (budget {TRAIN_PY_BUDGET}): the command line and the "
                                  "trained-run modes belong in minattn/lab/cli.py, what is specific to a paper "
                                  "or task in its recipe (minattn/lab/recipes/)")
    # the budget is met by saying less, not by widening lines
    wide = sum(len(line) > WIDE for line in lines)
    assert wide <= WIDE_SHARE * n, f"train.py: {wide} of {n} lines are wider than {WIDE} characters (at most 5%)"
    # train.py reaches the data through the recipes, never through the catalogue script
    assert "tasks" not in set(_imported_modules(os.path.join(ROOT, "train.py")))


# --- the core a student reads in one sitting ---------------------------------------------------------------
BACKWARD_BUDGET = 45     # lines of Tensor.backward, docstring included (micrograd's is 17, tinygrad's 34)
FILE_BUDGET = 700        # lines of any source file: a longer one is probably doing two jobs


def _sources():
    for top in ("minattn", "tests"):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            yield from (os.path.join(folder, n) for n in files if n.endswith(".py"))
    yield from (os.path.join(ROOT, n) for n in ("train.py", "tasks.py"))


def test_backward_reads_as_the_textbook_algorithm():
    import inspect

    from minattn import engine
    n = len(inspect.getsource(engine.Tensor.backward).splitlines())
    assert n <= BACKWARD_BUDGET, (f"Tensor.backward has {n} lines (budget {BACKWARD_BUDGET}): how gradients are added "
                                  "belongs in an Accumulation policy (minattn/fast/accumulate.py), not in the loop")


def test_no_source_file_is_over_its_budget():
    long = []
    for path in _sources():
        with open(path) as f:
            n = len(f.readlines())
        if n > FILE_BUDGET:
            long.append(f"{os.path.relpath(path, ROOT)}: {n} lines")
    assert not long, f"over {FILE_BUDGET} lines (split by kind, as minattn/ops/ is): {long}"


def test_the_core_does_not_import_the_annex():
    """A reader can delete minattn/fast/ mentally: the core joins it only through engine.faster(), and only
    the package's __init__ imports it (so that its files register their faster forms)."""
    offenders = []
    for path in _sources():
        rel = os.path.relpath(path, ROOT)
        parts = rel.split(os.sep)
        if parts[0] != "minattn" or parts[1] in ("fast", "lab", "tools", "__init__.py"):
            continue   # the tools (the counter, gpucheck) switch the annex's forms on and off
        if any(m == "minattn.fast" or m.startswith("minattn.fast.") for m in _imported_modules(path)):
            offenders.append(rel)
    assert not offenders, offenders


def test_the_library_does_not_import_the_lab_or_the_tools():
    """Two wings: a reader who came for a mechanism or for autograd never has to open a file about running
    experiments. minattn/lab/ and minattn/tools/ import the library; nothing else in minattn/ imports them."""
    offenders = set()
    for path in _sources():
        parts = os.path.relpath(path, ROOT).split(os.sep)
        if parts[0] == "minattn" and parts[1] not in ("lab", "tools"):
            offenders |= {f"{'/'.join(parts)} imports {m}" for m in _imported_modules(path)
                          if m.startswith(("minattn.lab", "minattn.tools"))}
    assert not offenders, sorted(offenders)


def test_rundir_does_not_import_the_recipes():
    assert not [m for m in _imported_modules(os.path.join(ROOT, "minattn", "lab", "rundir.py")) if m and "recipes" in m]
    with open(os.path.join(ROOT, "minattn", "lab", "rundir.py")) as f:
        assert "from .recipes" not in f.read()


def test_the_annex_imports_only_the_core():
    """minattn/fast/ is the speed annex of the core (engine, ops, functional, nn, optim, backend): it may not
    import a mechanism or a model, except the files of the one mechanism the annex knows, NDR's geometric
    attention and copy-gate layer (fast/geometric.py and the GPU kernels' files), which say so in their headers."""
    above = ("minattn.attention", "minattn.models", "minattn.data", "minattn.lab", "minattn.tools")
    offenders = set()
    for path in _sources():
        parts = os.path.relpath(path, ROOT).split(os.sep)
        if parts[:2] == ["minattn", "fast"] and parts[2] not in ("geometric.py", "kernels_geometric.py",
                                                                "kernels_layer.py"):
            offenders |= {f"{'/'.join(parts)} imports {m}" for m in _imported_modules(path) if m.startswith(above)}
    assert not offenders, sorted(offenders)


WIDTH = 110            # characters: no source line wider (the anchors: micrograd 0, nanoGPT ≤ 5% over 100)
WIDE, WIDE_SHARE = 100, 0.05


def test_source_lines_stay_narrow():
    """Source lines (the package, train.py, tasks.py; not the tests) fit in WIDTH characters, and at most
    WIDE_SHARE of them are wider than WIDE: a reader's window, a side-by-side diff, a printed page."""
    wide, total, over = 0, 0, []
    for path in _sources():
        rel = os.path.relpath(path, ROOT)
        if rel.startswith("tests"):
            continue
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        total += len(lines)
        wide += sum(len(line) > WIDE for line in lines)
        over += [f"{rel}:{n}" for n, line in enumerate(lines, 1) if len(line) > WIDTH]
    assert not over, f"{len(over)} source lines wider than {WIDTH} characters: {over[:20]}"
    assert wide <= WIDE_SHARE * total, f"{wide} of {total} source lines ({wide / total:.1%}) are wider than {WIDE}"


def test_the_library_and_paper_tests_build_models_without_train_py():
    """tests/library/ and tests/papers/ build models through the models' config classes or the recipes
    (minattn/lab/recipes, minattn/lab/settings.make_config), never through the top-level train.py: what
    trains through train.py is a test of the lab (tests/lab/)."""
    offenders = []
    for top in ("library", "papers"):
        for folder, _, files in os.walk(os.path.join(ROOT, "tests", top)):
            for name in files:
                path = os.path.join(folder, name)
                if name.endswith(".py") and "train" in set(_imported_modules(path)):
                    offenders.append(os.path.relpath(path, ROOT))
    assert not offenders, offenders


# --- the house's size: take a room down for each one added --------------------------------------------------
SOURCE_BUDGET = 12_300   # lines of minattn/**, train.py and tasks.py (13,235 at 8717cd2)
ROOM_BUDGETS = {         # rooms a reader walks or a promise lives in, each with its own ceiling
    "minattn/attention/geometric.py": 170,   # header → the equations as code → the module (246 at 8717cd2)
    "minattn/lab/rundir.py": 350,            # every run-directory promise, one file opener (576 at 8717cd2)
}


def test_the_source_stays_within_its_budget():
    """Every line counts, docstrings included; fewer lines by joining them does not count, since the width
    rule (test_source_lines_stay_narrow) holds the lines to the same measure."""
    counts = {os.path.relpath(p, ROOT): len(open(p, encoding="utf-8").readlines())
              for p in _sources() if not os.path.relpath(p, ROOT).startswith("tests")}
    total = sum(counts.values())
    assert total <= SOURCE_BUDGET, (f"the source is {total} lines (budget {SOURCE_BUDGET}): take a room down "
                                    f"for the one you add; the largest: {sorted(counts.items(), key=lambda kv: -kv[1])[:5]}")
    over = {room: counts[room] for room, budget in ROOM_BUDGETS.items() if counts[room] > budget}
    assert not over, f"over their budgets {ROOM_BUDGETS}: {over}"
