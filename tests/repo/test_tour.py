"""docs/tour.md, the guided reading, run as a reader runs it: its python blocks pasted in order into one
interactive session (line by line, as `python`'s prompt reads them, echoes included), each one's output equal
to the text block that follows it (as tests/repo/test_design_notes.py runs the design notes). A tour that drifts from the
code, or a block that pastes badly (a blank line inside a class, a statement right after a loop body), fails
here."""
import code
import contextlib
import io
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tour_steps():
    """[(python code, the text block after it)]: each python block of docs/tour.md comes with its output."""
    with open(os.path.join(ROOT, "docs", "tour.md")) as f:
        return re.findall(r"```python\n(.*?)```\n```text\n(.*?)```", f.read(), re.S)


def test_every_python_block_has_its_output():
    with open(os.path.join(ROOT, "docs", "tour.md")) as f:
        assert f.read().count("```python") == len(tour_steps()) >= 8


class Prompt(code.InteractiveConsole):
    """The `python` prompt: lines pushed one at a time; an error it would print fails the test."""
    def write(self, data):
        raise AssertionError(f"the prompt printed an error:\n{data}")


def test_the_tour_pastes_into_python_and_prints_what_it_says():
    prompt = Prompt({})
    for block, want in tour_steps():
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            for line in block.splitlines() + [""]:     # the reader presses Enter after the paste
                prompt.push(line)
        assert out.getvalue() == want, f"this block printed\n{out.getvalue()}instead of\n{want}\n{block}"
