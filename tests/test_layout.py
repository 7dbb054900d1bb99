"""The house's layout: imports go one way (nothing in minattn/ imports the top-level tasks.py or
train.py; the core never imports the speed annex minattn/fast/; rundir.py not the recipes), and the
budgets: train.py's lines, Tensor.backward's lines, and every source file's."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _imported_modules(path):
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.module


def test_nothing_in_the_package_imports_the_top_level_scripts():
    offenders = []
    for folder, _, files in os.walk(os.path.join(ROOT, "minattn")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                offenders += [f"{os.path.relpath(path, ROOT)} imports {m}" for m in _imported_modules(path)
                              if m.split(".")[0] in ("tasks", "train")]
    assert not offenders, offenders


TRAIN_PY_BUDGET = 550   # lines: train.py is the loop and the command line; recipes live in minattn/lab/recipes/


def test_train_py_stays_the_loop_and_the_command_line():
    with open(os.path.join(ROOT, "train.py")) as f:
        n = len(f.readlines())
    assert n <= TRAIN_PY_BUDGET, (f"train.py has {n} lines (budget {TRAIN_PY_BUDGET}): move what is specific to a "
                                  "paper or task into its recipe (minattn/lab/recipes/), run-directory code into "
                                  "minattn/lab/rundir.py")
    # train.py reaches the data through the recipes, never through the catalogue script
    assert "tasks" not in set(_imported_modules(os.path.join(ROOT, "train.py")))


# --- the core a student reads in one sitting (issue 33) -------------------------------------------------
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
        if rel.startswith(os.path.join("minattn", "fast")) or rel == os.path.join("minattn", "__init__.py"):
            continue
        if not rel.startswith("minattn"):
            continue
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            names = ([node.module or ""] + [a.name for a in node.names] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            if any(n == "fast" or n.startswith("fast.") or n.startswith("minattn.fast") for n in names):
                offenders.append(rel)
    assert not offenders, offenders


def _absolute_imports(path):
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


def test_the_library_does_not_import_the_lab_or_the_tools():
    """Two wings: a reader who came for a mechanism or for autograd never has to open a file about running
    experiments. minattn/lab/ and minattn/tools/ import the library; nothing else in minattn/ imports them."""
    offenders = set()
    for path in _sources():
        parts = os.path.relpath(path, ROOT).split(os.sep)
        if parts[0] == "minattn" and parts[1] not in ("lab", "tools"):
            offenders |= {f"{'/'.join(parts)} imports {m}" for m in _absolute_imports(path)
                          if m.startswith(("minattn.lab", "minattn.tools"))}
    assert not offenders, sorted(offenders)


def test_rundir_does_not_import_the_recipes():
    assert not [m for m in _imported_modules(os.path.join(ROOT, "minattn", "lab", "rundir.py")) if m and "recipes" in m]
    with open(os.path.join(ROOT, "minattn", "lab", "rundir.py")) as f:
        assert "from .recipes" not in f.read()
