"""Every reference in the files below points at something a reader can open: the paper (with its
section, equation or table), the authors' code, or a design note under docs/. Guards against the
return of citations of notes that are not in the repository ("spec ndr.md §3"), and checks that every
"docs/NAME.md §N" names a section that exists.

A file may declare a default note for its bare section numbers with the sentence
    Section numbers (§) without "paper" are those of docs/NAME.md.
(or "...below without "paper" are those of docs/NAME.md"); a bare "§N" there must then resolve in that
note. A "§N" on a line that names a paper ("paper", "et al.", "Appendix", an author and year) is a
paper citation and is not checked against docs/.
"""
import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The files this guard covers: every Python file of the package, the training script, the catalogue, the
# tests, the README and the design notes.
def _glob(pattern):
    return [os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern), recursive=True)]


CLEANED = sorted(["tasks.py", "train.py", "README.md"] + _glob("minattn/**/*.py")
                 + _glob("tests/*.py") + _glob("docs/*.md"))
NOTES = ("ndr", "coda", "compositional", "abstractor", "seq2attn", "names")
FORBIDDEN = [re.compile(r"\bspec\b", re.I),                                    # "spec ndr.md §3", "the spec's"
             re.compile(r"(?<![\w/])(%s)\.md\b" % "|".join(NOTES))]             # a note named without docs/
DOC_REF = re.compile(r"docs/(\w+)\.md((?:,? §\d+(?:\.\d+)?(?:[–-]\d+(?:\.\d+)?)?)*)")
SECTION = re.compile(r"§(\d+(?:\.\d+)?)")
DEFAULT = re.compile(r'Section numbers (?:\(§\) )?(?:below )?without "paper" are those of\s+docs/(\w+)\.md')
PAPER = re.compile(r"paper|et al\.|Appendix|Algorithm|Eqs?\. \d|Table \d|Fig\. \d|\d{4}\b|\", §", re.I)
THIS_FILE = os.path.relpath(__file__, ROOT)


def _headings(note):
    with open(os.path.join(ROOT, "docs", f"{note}.md")) as f:
        return {m.group(1) for m in re.finditer(r"^#+ (\d+(?:\.\d+)?)\.? ", f.read(), re.M)}


def _lines(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read().splitlines()


@pytest.mark.parametrize("path", [p for p in CLEANED if p != THIS_FILE])
def test_no_citation_of_notes_outside_the_repository(path):
    bad = [f"{path}:{i}: {line.strip()}" for i, line in enumerate(_lines(path), 1)
           if any(p.search(line) for p in FORBIDDEN)]
    assert not bad, "cite the paper, the authors' code or a note under docs/ instead:\n" + "\n".join(bad)


@pytest.mark.parametrize("path", [p for p in CLEANED if p != THIS_FILE])
def test_every_section_number_resolves(path):
    text = "\n".join(_lines(path))
    default = DEFAULT.search(text.replace("\n", " "))
    default = default.group(1) if default else None
    missing = []
    for i, line in enumerate(_lines(path), 1):
        rest = line
        for m in DOC_REF.finditer(line):
            heads = _headings(m.group(1))
            missing += [f"{path}:{i}: docs/{m.group(1)}.md §{s}" for s in SECTION.findall(m.group(2))
                        if s not in heads]
            rest = rest.replace(m.group(0), "")
        bare = SECTION.findall(rest)
        if not bare or PAPER.search(rest) or path.startswith("docs/"):
            continue          # a paper's own section numbers, or a note's references to its own sections
        if default is None:
            missing.append(f"{path}:{i}: bare {', '.join('§' + s for s in bare)} and no default note declared")
        else:
            missing += [f"{path}:{i}: §{s} is not a section of docs/{default}.md" for s in bare
                        if s not in _headings(default)]
    assert not missing, "\n".join(missing)
