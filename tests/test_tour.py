"""docs/tour.md, the guided reading, run as a reader runs it: its python blocks in order in one namespace,
each one's printed output equal to the text block that follows it (as tests/test_docs.py runs the design
notes). A tour that drifts from the code fails here."""
import contextlib
import io
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tour_steps():
    """[(python code, the text block after it)]: each python block of docs/tour.md comes with its output."""
    with open(os.path.join(ROOT, "docs", "tour.md")) as f:
        return re.findall(r"```python\n(.*?)```\n```text\n(.*?)```", f.read(), re.S)


def test_every_python_block_has_its_output():
    with open(os.path.join(ROOT, "docs", "tour.md")) as f:
        assert f.read().count("```python") == len(tour_steps()) >= 8


def test_the_tour_prints_what_it_says():
    namespace = {}
    for code, want in tour_steps():
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(code, namespace)
        assert out.getvalue() == want, f"this block printed\n{out.getvalue()}instead of\n{want}\n{code}"
