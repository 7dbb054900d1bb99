"""The house's layout: imports go one way (nothing in minattn/ imports the top-level tasks.py or
train.py), and train.py stays within its line budget."""
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


TRAIN_PY_BUDGET = 550   # lines: train.py is the loop and the command line; recipes live in minattn/recipes/


def test_train_py_stays_the_loop_and_the_command_line():
    with open(os.path.join(ROOT, "train.py")) as f:
        n = len(f.readlines())
    assert n <= TRAIN_PY_BUDGET, (f"train.py has {n} lines (budget {TRAIN_PY_BUDGET}): move what is specific to a "
                                  "paper or task into its recipe (minattn/recipes/), run-directory code into "
                                  "minattn/rundir.py")
    # train.py reaches the data through the recipes, never through the catalogue script
    assert "tasks" not in set(_imported_modules(os.path.join(ROOT, "train.py")))
