"""The seq2seq tasks of tasks.py (docs/seq2attn.md §2–3): lookup tables and SCAN match the reference
files (line counts and md5 sums of their C-sorted lines), batching, and the export command line.
Section numbers (§) without "paper" are those of docs/seq2attn.md."""
import hashlib
import itertools
import os
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
import tasks  # noqa: E402
from minattn.data import seq2attn as seq2seq  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def sorted_md5(lines):
    """md5 of `LC_ALL=C sort FILE` (§2.4): lines sorted as bytes, each followed by a newline."""
    return hashlib.md5(b"".join(sorted(line.encode() + b"\n" for line in lines))).hexdigest()


@pytest.fixture(scope="module")
def lookup():
    return tasks.get_task("lookup")


# --- lookup tables ----------------------------------------------------------------------------------------

LOOKUP_FILES = {  # §2.4: the rule-built files of sample1
    "train": (232, "cdadf32d85cd6d8e5292aaac7f2ca53c"),
    "validation": (16, "2a19637b24d43533caf3e5ebc559eff1"),
    "heldout_inputs": (40, "932f0aee7dff1bee9d6f977e8ff1180d"),
    "heldout_compositions": (64, "b35c157c3a9f0b939ca515ca1a0970d4"),
    "heldout_tables": (192, "86c1bb521ca7e4e73b73a45874bd0f48"),
    "new_compositions": (32, "527d10f08c228a840641779f55286650"),
}


@pytest.mark.parametrize("name", LOOKUP_FILES)
def test_lookup_rule_built_splits_match_sample1(lookup, name):
    lines = lookup.splits[name].lines
    assert (len(lines), sorted_md5(lines)) == LOOKUP_FILES[name]


def _compose(bits, tables):
    """Independent of the generator: tables as permutation lists indexed by the integer value."""
    perms = {t: [int(v, 2) for v in row.split()] for t, row in seq2seq.LOOKUP_TABLES.items()}
    x, out = int(bits, 2), [bits]
    for t in tables:
        x = perms[t][x]
        out.append(f"{x:03b}")
    return out


def test_lookup_every_line_is_a_correct_composition(lookup):
    assert seq2seq.lookup_example("100", ["t3", "t1"])[2] == "100 t3 t1 .\t100 011 010\t0 1 2 3"  # §2.2
    for name, split in lookup.splits.items():
        for line, x, y in zip(split.lines, split.inputs, split.targets):
            src, tgt, attn = line.split("\t")
            bits, *tables, dot = src.split()
            assert dot == "." and tgt.split() == _compose(bits, tables), line
            assert attn.split() == [str(i) for i in range(len(tables) + 2)], line
            assert [split.in_vocab[i] for i in x] == src.split()
            assert [split.out_vocab[i] for i in y] == tgt.split() + ["<eos>"]


def test_lookup_longer_compositions_have_the_reference_structure(lookup):
    def comps(name):
        lines = lookup.splits[f"longer_compositions_{name}"].lines
        per = {}
        for line in lines:
            bits, *tables, _ = line.split("\t")[0].split()
            per.setdefault(tuple(tables), set()).add(bits)
        assert all(len(inputs) == 4 for inputs in per.values()) and len(lines) == 4 * len(per)
        return set(per)
    seen, incremental, new = comps("seen"), comps("incremental"), comps("new")
    S6, T78 = {f"t{i}" for i in range(1, 7)}, {"t7", "t8"}
    assert len(seen) == 136 and all(set(c) <= S6 for c in seen)
    assert new == set(itertools.product(["t7", "t8"], repeat=3))
    kinds = [(c[0] in T78, c[1] in T78) for c in incremental]
    assert len(incremental) == 271 and not any(c[2] in T78 for c in incremental)
    assert [kinds.count(k) for k in [(False, False), (True, False), (False, True), (True, True)]] == [150, 56, 50, 15]
    assert len(incremental & seen) == 96


def test_lookup_vocabularies_and_seeds(lookup):
    assert (len(lookup.in_vocab), len(lookup.out_vocab)) == (19, 12)                      # §1.1
    assert lookup.decode(lookup.splits["train"].targets[0]) == "000 110 <eos>"             # t1(000) = 110
    other = tasks.get_task("lookup", seed=1)
    assert other.splits["train"].lines == lookup.splits["train"].lines                 # rule-built: seed-free
    assert other.splits["longer_compositions_seen"].lines != lookup.splits["longer_compositions_seen"].lines
    assert tasks.get_task("lookup").splits["longer_compositions_seen"].lines == \
        lookup.splits["longer_compositions_seen"].lines


# --- SCAN -----------------------------------------------------------------------------------------------

SCAN_FILES = {  # §3.4: split -> {file: (lines, md5 of C-sorted lines)}
    "length": {"train": (16990, "47c6bcda51813555790799959b73d06f"),
               "test": (3920, "165706b4ce09dd97720e62d1e19be055")},
    "addprim_jump": {"train": (14670, "284c099e5c77486947c3e210ee2be11a"),
                     "test": (7706, "e2bcde372342d37dc3b9f55a9428c203")},
    "addprim_turn_left": {"train": (21890, "73ccf4480cb3a711c30b4d2c8c6ad4ee"),
                          "test": (1208, "b7bf764d3804f58505fb4c8a92ea411e")},
    "around_right": {"train": (15225, "3b59da853676bce07a3a358a6edbd189"),
                     "test": (4476, "87238440d9df0629ef6e6d23c7d05a28")},
    "opposite_right": {"train": (15225, "532284dc85c1942a876fdf2055500be4"),
                       "test": (4476, "35dbb81e77c11872c186818139c0c6f3")},
    "right": {"train": (15225, "7ac002ceca202540c718bcecef6fe10b"),
              "test": (4476, "cc65fdd55df64b2037dbe219fc5de07e")},
    "jump_around_right": {"train": (18528, "d024d8e8f1538087a50ae6a6cb8d77da"),
                          "test": (1173, "7ed9cd7b2a54ec8c3cb207b6d08f1a0c")},
    "filler0": {"train": (15225, "3b59da853676bce07a3a358a6edbd189")},
    "filler1": {"train": (16290, "f8a5672b95ce6b71d0c37fce4eb383c2")},
    "filler2": {"train": (17391, "18aa9dd13bacdc3d8c6b3ef07d0133c6")},
    "filler3": {"train": (18528, "d024d8e8f1538087a50ae6a6cb8d77da")},
}
for _k in range(4):
    SCAN_FILES[f"filler{_k}"]["test"] = SCAN_FILES["jump_around_right"]["test"]
CUTOFFS = {  # §3.5 (pool in C-sorted order): K -> train / iid / ood (lines, md5)
    22: ((15292, "d26a12fd8096b12b89a4cd602adde577"), (1698, "c5a67e24a59902e1481e23a281f34887"),
         (3920, "165706b4ce09dd97720e62d1e19be055")),
    24: ((15594, "222a55ba13e0923eb37a8b5689ea6d30"), (1732, "5e75d4a56c82a6f99158729db6d08200"),
         (3584, "a8aceaae87e5c8cbd80666bf9b23b0e1")),
    25: ((15997, "3dd63f9abe74568f1d650abb488f31aa"), (1777, "ee25106f5f343a0e3cf9c231ee65ee8c"),
         (3136, "2c0e487bebdf9e58cc8a0750c3abc1ba")),
    26: ((16458, "fe5ef0ef4a73a70d141d3b3e5ac14e49"), (1828, "57c3d528f64478521d3c564e5f58a6dd"),
         (2624, "32a7841fe6f7c63da7be0a34a493f50a")),
    27: ((16861, "00ae0cbc0ce05cb7b60ce2eff7be8093"), (1873, "9cf160d791142a6154a6281b5f965dd1"),
         (2176, "0f8c016782cbf045426e9e1497b640a2")),
    28: ((17264, "ae4d3c35ae8daedaadb11c990bf71946"), (1918, "d9c06fc0769f9e6819e35b457efe1b85"),
         (1728, "6b3758b26fca37588033e8a858b6c87f")),
    30: ((17783, "afbd3f8435df6acf9f7165de435c773c"), (1975, "32fd11b61c8ac85cd5e0a51e5422e641"),
         (1152, "d670a239638ef1c4e10972955051b989")),
    32: ((18186, "10b699f9a5164c97ff8085ad060daf92"), (2020, "4d6851dd7ffadf29b8fba33e4548d54f"),
         (704, "18dddbdd10b02212dfe73a161ce8722c")),
    33: ((18416, "fb839f149300dd46dc718db29faf71ae"), (2046, "053d516ba5454aeb1ef5b6739a779249"),
         (448, "9fae3b151384a471274ca700f013d5e3")),
    36: ((18474, "b422c285a4da08c6f5a29889bc58845e"), (2052, "01643213327edf3a92fcee361089e2c5"),
         (384, "f52ff80bcaa437a871a11ff70dc6f578")),
    40: ((18704, "d879ac2f56b49a163198a6e3919f41e7"), (2078, "b238c3567ace42a1e77ab3b2f2eb92ad"),
         (128, "3dbf1076f4bad0505e13b6ce7cae28c5")),
}


def test_scan_grammar_gives_the_20910_reference_commands():
    pairs = seq2seq.scan_commands()
    lines = [seq2seq.scan_line(p) for p in pairs]
    assert len(set(lines)) == len(lines) == 20910
    assert sorted_md5(lines) == "52d3ae22c3483a66396c82d4939f9450"
    assert max(len(c.split()) for c, _ in pairs) == 9
    lengths = np.bincount([len(a) for _, a in pairs])
    assert (lengths[1:23] > 0).all() and lengths[:23].sum() == 16990 and lengths[23] == 0
    assert {k: lengths[k] for k in np.flatnonzero(lengths) if k > 22} == {
        24: 336, 25: 448, 26: 512, 27: 448, 28: 448, 30: 576, 32: 448, 33: 256, 36: 64, 40: 256, 48: 128}
    assert "IN: jump opposite left after walk around left OUT: I_TURN_LEFT I_WALK I_TURN_LEFT I_WALK I_TURN_LEFT " \
           "I_WALK I_TURN_LEFT I_WALK I_TURN_LEFT I_TURN_LEFT I_JUMP" in lines                      # §3.2


@pytest.mark.parametrize("split", SCAN_FILES)
def test_scan_rule_splits_match_the_reference_files(split):
    task = tasks.get_task("scan", split=split)
    assert (len(task.in_vocab), len(task.out_vocab)) == (15, 10)                          # §1.1
    assert {k: (len(s), sorted_md5(s.lines)) for k, s in task.splits.items()} == SCAN_FILES[split]


@pytest.mark.parametrize("k", seq2seq.SCAN_CUTOFFS)
def test_scan_length_cutoff_resplits(k):
    got = tasks.scan_split(f"length_cutoff_{k}")
    lines = {name: [seq2seq.scan_line(p) for p in got[name]] for name in ("train", "iid", "test")}
    assert tuple((len(v), sorted_md5(v)) for v in lines.values()) == CUTOFFS[k]


def test_scan_simple_split_is_a_seeded_80_20_partition():
    a, b = (tasks.scan_split("simple", seed) for seed in (0, 1))
    all_lines = {seq2seq.scan_line(p) for p in seq2seq.scan_commands()}
    train, test = ({seq2seq.scan_line(p) for p in a[k]} for k in ("train", "test"))
    assert (len(a["train"]), len(a["test"])) == (len(train), len(test)) == (16728, 4182)
    assert not train & test and train | test == all_lines
    assert a == tasks.scan_split("simple", 0) and a["test"] != b["test"]


@pytest.mark.parametrize("split,message", [("", "needs a split"), ("fillerX", "unknown SCAN split"),
                                           ("length_cutoff_x", "integer K"), ("addprim_walk", "add_prim")])
def test_scan_bad_split_names_are_clear_errors(split, message):
    with pytest.raises(ValueError, match=message):
        tasks.get_task("scan", split=split)


# --- batching -----------------------------------------------------------------------------------------------

def test_batches_pad_and_cover_every_example_once_per_epoch(lookup):
    split = lookup.splits["train"]   # 232 examples: 64 unary (targets of 3 tokens), 168 binary (4)
    pad_in, pad_out = split.in_vocab.index("<pad>"), split.out_vocab.index("<pad>")
    spread = {}
    for mode in ("shuffled", "bucketed"):
        stream = split.batches(10, np.random.default_rng(0), mode)
        epoch = [next(stream) for _ in range(24)]                  # ceil(232 / 10): the last one has 2
        assert sorted(len(b[1]) for b in epoch)[0] == 2
        rows = set()
        for src, src_len, tgt, tgt_len in epoch:
            for x, n, y, m in zip(src, src_len, tgt, tgt_len):
                assert (x[n:] == pad_in).all() and (y[m:] == pad_out).all() and y[m - 1] == lookup.eos
                rows.add((tuple(x[:n]), tuple(y[:m])))
        assert len(rows) == len(split)
        again = split.batches(10, np.random.default_rng(0), mode)
        assert all(all((u == v).all() for u, v in zip(b, next(again))) for b in epoch)      # replayable
        spread[mode] = np.mean([np.ptp(b[3]) for b in epoch])
    assert spread["bucketed"] < 0.1 < 0.5 < spread["shuffled"]     # bucketing: one target length per batch


def test_eval_batches_visit_each_example_once(lookup):
    split = lookup.splits["heldout_tables"]
    seen = [tuple(x[:n]) for src, src_len, _, _ in split.eval_batches(50) for x, n in zip(src, src_len)]
    assert sorted(seen) == sorted(tuple(x) for x in split.inputs)
    rows = [3, 0, 17, 5]   # or only the given rows, each once
    seen = [tuple(x[:n]) for src, src_len, _, _ in split.eval_batches(3, rows) for x, n in zip(src, src_len)]
    assert sorted(seen) == sorted(tuple(split.inputs[i]) for i in rows)


def test_bad_batching_requests_fail_at_call_time(lookup):
    with pytest.raises(ValueError, match="batching mode"):
        lookup.splits["train"].batches(8, np.random.default_rng(0), "random")
    with pytest.raises(ValueError, match="batch_size"):
        lookup.splits["train"].batches(0, np.random.default_rng(0))


# --- command line ---------------------------------------------------------------------------------------------

def _cli(*args):
    return subprocess.run([sys.executable, "tasks.py", *args], cwd=ROOT, capture_output=True, text=True)


def test_export_scan_split_and_all(tmp_path):
    assert _cli("export", "--task", "scan", "--split", "filler1", "--out", str(tmp_path / "f1")).returncode == 0
    for name in ("train", "test"):
        lines = (tmp_path / "f1" / f"{name}.txt").read_text().splitlines()
        assert (len(lines), sorted_md5(lines)) == SCAN_FILES["filler1"][name]
    assert _cli("export", "--task", "scan", "--split", "all", "--out", str(tmp_path / "all")).returncode == 0
    text = (tmp_path / "all" / "all.txt").read_text()
    assert text.endswith("\n") and sorted_md5(text.splitlines()) == "52d3ae22c3483a66396c82d4939f9450"


def test_export_lookup_writes_one_tsv_per_split(tmp_path):
    assert _cli("export", "--task", "lookup", "--out", str(tmp_path)).returncode == 0
    assert sorted(os.listdir(tmp_path)) == sorted(f"{k}.tsv" for k in tasks.get_task("lookup").splits)
    for name, (n, md5) in LOOKUP_FILES.items():
        assert sorted_md5((tmp_path / f"{name}.tsv").read_text().splitlines()) == md5


@pytest.mark.parametrize("args,message", [
    (["--task", "scan"], "needs a split"), (["--task", "scan", "--split", "bogus"], "unknown SCAN split"),
    (["--task", "lookup", "--split", "length"], "drop --split")])
def test_export_errors_are_one_line_with_exit_2(tmp_path, args, message):
    p = _cli("export", *args, "--out", str(tmp_path))
    assert p.returncode == 2 and message in p.stderr and p.stderr.count("\n") == 1
