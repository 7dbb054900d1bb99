"""Every definition a paper states is pinned by a test that names it (issue 47 item 1).

Each design note docs/<paper>.md ends with "Definitions and the tests that pin them": a table whose rows
are | Row | Definition | Source | `tests/...py::test_name` |. Checked here, from the files' text and their
syntax trees (nothing is imported or run): the table is the note's last section; its row names are unique;
every row's test exists in its file, and that test's docstring starts with "docs/<paper>.md ROW:"; and
every test of tests/papers/<paper>/test_definitions.py has its row, so a new definition test cannot go
unlisted, nor a listed one be deleted or renamed unnoticed.
"""
import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAPERS = ("ndr", "coda", "abstractor", "compositional", "seq2attn")
HEADING = "Definitions and the tests that pin them"


def table(text):
    """The table rows of the note's definitions section as (row, test file, test name), and the problems
    found reading it."""
    headings = re.findall(r"^## .*$", text, re.M)
    if not headings or HEADING not in headings[-1]:
        return [], [f'the last section is not "{HEADING}"']
    rows, problems = [], []
    for line in text[text.index(headings[-1]):].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) < 2 or cells[0] == "Row" or set(cells[0]) <= set("-: "):
            continue
        ref = re.fullmatch(r"`(tests/[\w/]+\.py)::(test_\w+)`", cells[-1])
        if len(cells) != 4 or ref is None:
            problems.append(f"row {cells[0]!r}: want | Row | Definition | Source | `tests/...py::name` |")
            continue
        rows.append((cells[0], ref[1], ref[2]))
    return rows, problems


def definition_tests(path):
    """{name: docstring} of the module-level test functions of a test file (its syntax tree)."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    return {n.name: ast.get_docstring(n) or "" for n in tree.body
            if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


def problems(paper, text):
    """Everything wrong with ``paper``'s table (``text``: its note), one line each; [] when none."""
    rows, found = table(text)
    if not rows:
        return found + ["the table has no rows"]
    labels = [label for label, _, _ in rows]
    found += [f"row {label!r} twice" for label in sorted(set(labels)) if labels.count(label) > 1]
    files = {}
    for label, path, name in rows:
        if not os.path.isfile(os.path.join(ROOT, path)):
            found.append(f"row {label!r}: no file {path}")
            continue
        tests = files.setdefault(path, definition_tests(path))
        head = f"docs/{paper}.md {label}:"
        if name not in tests:
            found.append(f"row {label!r}: {path} has no {name}")
        elif not tests[name].startswith(head):
            found.append(f"row {label!r}: the docstring of {name} does not start with {head!r}")
    own = f"tests/papers/{paper}/test_definitions.py"
    listed = {name for _, path, name in rows if path == own}
    unlisted = sorted(set(definition_tests(own)) - listed)
    found += [f"{own}::{name} has no row in docs/{paper}.md" for name in unlisted]
    return found


def note(paper):
    with open(os.path.join(ROOT, "docs", f"{paper}.md"), encoding="utf-8") as f:
        return f.read()


@pytest.mark.parametrize("paper", PAPERS)
def test_every_definition_row_names_its_test_and_every_test_its_row(paper):
    assert problems(paper, note(paper)) == []


def test_a_missing_row_or_a_test_that_does_not_name_its_row_is_found():
    """The check can fail: a row deleted from the NDR table leaves its test unlisted; a row whose label no
    longer matches its test's docstring, or whose test is gone, is named."""
    text = note("ndr")
    rows, _ = table(text)
    label, path, name = rows[0]
    line = next(li for li in text.splitlines() if li.startswith(f"| {label} |"))
    assert problems("ndr", text.replace(line + "\n", "")) == [f"{path}::{name} has no row in docs/ndr.md"]
    renamed = text.replace(line, line.replace(f"| {label} |", "| Eq. 99 |"))
    assert problems("ndr", renamed) == [f"row 'Eq. 99': the docstring of {name} does not start with "
                                        f"'docs/ndr.md Eq. 99:'"]
    gone = text.replace(line, line.replace(name, "test_gone"))
    assert problems("ndr", gone) == [f"row {label!r}: {path} has no test_gone",
                                     f"{path}::{name} has no row in docs/ndr.md"]
    assert problems("ndr", text + "\n## Later\n") == [f'the last section is not "{HEADING}"',
                                                     "the table has no rows"]
