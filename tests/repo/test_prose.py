"""The lab's sweep (issue 40 item 5): what a reader meets is true and said one way."""
import os
import re

import tasks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_task_catalogue_names_generator_files_that_exist():
    rows = [line.split("|") for line in tasks.__doc__.splitlines() if line.startswith("| ") and ".py" in line]
    named = {cells[3].strip() for cells in rows}
    assert len(rows) == 8 and named, rows
    missing = [n for n in named if not os.path.isfile(os.path.join(ROOT, "minattn", "data", n))]
    assert not missing, f"tasks.py --help names generators that do not exist: {missing}"


def test_recipes_move_a_batch_one_way():
    """``self.to_device`` (Recipe.to_device) at every site, never backend.to_device with the run's device."""
    folder = os.path.join(ROOT, "minattn", "lab", "recipes")
    offenders = [f"{name}:{i}" for name in sorted(os.listdir(folder)) if name.endswith(".py") and name != "base.py"
                 for i, line in enumerate(open(os.path.join(folder, name)), 1)
                 if re.search(r"backend\.to_device", line)]
    assert not offenders, offenders
