"""Every training command that README.md and RESULTS.md give (inline, fenced or indented) still resolves: each
`python train.py ...` with a --task, run with --show-config (nothing is trained or written). Placeholders are
filled in: MODEL with every model of the task, a|b with each, N with 500, S with 1, DIR with a name."""
import os
import re
import shlex
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
import train  # noqa: E402

PLACEHOLDERS = {"N": "500", "S": "1", "DIR": "runs/x", "RUN": "runs/x"}
NOT_TRAINING = ("--report", "--resume", "--evaluate", "--plot", "--analyze")


def commands():
    found = []
    for name in ("README.md", "RESULTS.md"):
        with open(os.path.join(ROOT, name)) as f:
            text = f.read()
        inline = [" ".join(c.split()) for c in re.findall(r"`(python train\.py[^`]*)`", text)]
        blocks = [line.split("#")[0].strip() for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
                  for line in block.splitlines() if line.startswith("python train.py")]
        # indented (four-space) blocks, a backslash continuing a command on the next line
        indented = [" ".join(c.replace("\\\n", " ").split("#")[0].split())
                    for c in re.findall(r"^    (python train\.py(?:[^\n]*\\\n)*[^\n]*)", text, re.M)]
        found += [(name, c) for c in inline + blocks + indented]
    return [(name, c) for name, c in dict.fromkeys(found)
            if "--task" in c and "..." not in c and not any(m in c for m in NOT_TRAINING)]


def expand(command):
    """The argv lists a command stands for (MODEL: every model of its task; a|b: each)."""
    words = [re.sub(r"=([A-Z]+)$", lambda m: "=" + PLACEHOLDERS.get(m[1], m[1]), PLACEHOLDERS.get(w, w))
             for w in shlex.split(command)[2:]]
    task = words[words.index("--task") + 1]
    argvs = [[]]
    for w in words:
        options = list(train.recipe_for(task).models) if w == "MODEL" else w.split("|")
        argvs = [argv + [o] for argv in argvs for o in options]
    return argvs


COMMANDS = commands()


def test_the_documents_give_training_commands():
    assert len(COMMANDS) > 40


@pytest.mark.parametrize("source,command", COMMANDS, ids=[c[1][16:60] for c in COMMANDS])
def test_a_documented_command_resolves(source, command, capsys):
    for argv in expand(command):
        assert train.main(argv + ["--show-config"]) == 0, f"{source}: {' '.join(argv)}: {capsys.readouterr().err}"
