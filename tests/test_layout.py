"""The house's layout: imports go one way (nothing in minattn/ imports the top-level tasks.py or
train.py), and tasks.py still offers every name train.py reads from it."""
import ast
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import tasks  # noqa: E402


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


def test_tasks_py_offers_every_name_train_py_uses():
    with open(os.path.join(ROOT, "train.py")) as f:
        tree = ast.parse(f.read())
    used = {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "tasks"}
    assert used, "train.py no longer reads tasks.<name>: update this test"
    assert not [n for n in used if not hasattr(tasks, n)]
