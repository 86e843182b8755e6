"""training/corpus/mix.py: real ARC tasks mixed with a generated corpus's training split at a fraction, seeded,
heldout/ refused; and each entry point that takes the mix (training.traces, training.calibration_traces, training.grid_tune)."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from submission.tasks import load_tasks
from training.corpus import generate, mix
from training.corpus.dsl import MaskOp, SelectMaskRender, Selector
from training.corpus.mix import CorpusError, CorpusMix

PROGRAMS = [SelectMaskRender(Selector("size", "max"), MaskOp("dilate", 1), (), "crop_mask", 8),
            SelectMaskRender(Selector("n_colours", "max"), MaskOp("bbox", 1), (), "crop_source", 8)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A real generated corpus: two rules, up to three gated tasks each (5 on this seed, about 6 s)."""
    out = tmp_path_factory.mktemp("corpus") / "c"
    generate.generate(2, 3, 0, out, tries=2, programs=PROGRAMS)
    return out


@pytest.fixture(scope="module")
def real(arc_data):
    return load_tasks(arc_data / "arc-agi-2" / "training").tasks[:10]


def corpus_ids(corpus) -> set[str]:
    return {json.loads(line)["task"] for line in (corpus / "manifest.jsonl").read_text().splitlines()}


def test_the_fraction_is_the_corpus_share_and_the_seed_fixes_the_list(real, corpus):
    made = corpus_ids(corpus)
    assert len(made) >= 4
    for fraction, want in ((0.25, 3), (1 / 3, 5), (0.0, 0)):
        out = mix.mixed(real, corpus, fraction, seed=0)
        drawn = [t for t in out if t.id in made]
        assert len(out) == len(real) + want and len(drawn) == want  # round(fraction * 10 / (1 - fraction))
        assert sorted(t.id for t in out if t.id not in made) == sorted(t.id for t in real)  # every real task, once
        assert len({t.id for t in drawn}) == want  # without replacement
    again = mix.mixed(real, corpus, 0.25, seed=0)
    assert [t.id for t in again] == [t.id for t in mix.mixed(real, corpus, 0.25, seed=0)]
    assert [t.id for t in again] != [t.id for t in mix.mixed(real, corpus, 0.25, seed=1)]


def test_both_sources_are_labelled_tasks(real, corpus):
    out = mix.mixed(real, corpus, 1 / 3, seed=0)
    made = corpus_ids(corpus)
    assert {t.id for t in out} >= {t.id for t in real} and {t.id for t in out} & made
    for task in out:
        assert task.test_outputs is not None and len(task.test_outputs) == len(task.test_inputs)
        if task.id in made:
            assert (len(task.train), len(task.test_inputs)) == (5, 1)
    assert mix.apply(real, CorpusMix()) == list(real)  # no corpus named: the real tasks, in order


def test_the_mix_streams_the_manifest_and_reads_only_the_drawn_tasks(real, corpus, tmp_path):
    # a corpus whose undrawn task files are gone still mixes: only the manifest's names and the drawn files are read
    drawn = [t.id for t in mix.mixed(real[:4], corpus, 0.25, seed=0) if t.id in corpus_ids(corpus)]
    assert len(drawn) == 1  # round(0.25 * 4 / 0.75)
    thin = tmp_path / "thin"
    shutil.copytree(corpus, thin)
    for path in (thin / "tasks").glob("*.json"):
        if path.stem != drawn[0]:
            path.unlink()
    assert mix.mixed(real[:4], thin, 0.25, seed=0) == mix.mixed(real[:4], corpus, 0.25, seed=0)


def test_heldout_is_refused_and_never_mixed_in(real, corpus, tmp_path):
    for path in (corpus / "heldout", corpus / "heldout" / "x"):
        with pytest.raises(CorpusError, match=re.escape(f"{path}: a corpus's heldout/ folder")):
            mix.mixed(real, path, 0.25, seed=0)
    # a rule moved to the held-out split: the manifest says so, and the mix never draws its task
    copy = tmp_path / "c"
    shutil.copytree(corpus, copy)
    rows = [json.loads(line) for line in (copy / "manifest.jsonl").read_text().splitlines()]
    kept_apart = rows[0]["task"]
    (copy / "tasks" / f"{kept_apart}.json").rename(copy / "heldout" / f"{kept_apart}.json")
    rows[0]["split"] = "heldout"
    (copy / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [t.id for t in mix.split_tasks(copy, "heldout")] == [kept_apart]
    train = mix.training_tasks(copy)
    assert len(train) == len(rows) - 1 and kept_apart not in {t.id for t in train}
    assert kept_apart not in {t.id for t in mix.mixed(real[:4], copy, 0.5, seed=0)}


def test_bad_settings_are_refused_by_name(real, corpus, arc_data, tmp_path):
    for fraction in (1.0, -0.1, 1.5):
        with pytest.raises(CorpusError, match="corpus.fraction must be in"):
            CorpusMix(str(corpus), fraction)
        with pytest.raises(CorpusError, match="corpus.fraction must be in"):
            mix.mixed(real, corpus, fraction, seed=0)
    with pytest.raises(CorpusError, match="corpus.fraction is 0"):
        CorpusMix(str(corpus), 0.0)
    with pytest.raises(CorpusError, match=r"needs 10 corpus tasks; the corpus has \d"):
        mix.mixed(real, corpus, 0.5, seed=0)
    config = tmp_path / "run.toml"
    config.write_text(f'[corpus]\ndir = "{corpus}"\nfraction = 1\n')
    with pytest.raises(CorpusError, match=re.escape(f"{config}: [corpus]: corpus.fraction must be in")):
        mix.load_config(config)
    config.write_text('[corpus]\nshare = 0.5\n')
    with pytest.raises(CorpusError, match=re.escape(f"{config}: [corpus]: unknown key(s) share")):
        mix.load_config(config)
    training = arc_data / "arc-agi-2" / "training"
    with pytest.raises(CorpusError, match=re.escape(f"{training}: no manifest.jsonl: not a corpus folder")):
        mix.mixed(real, training, 0.25, seed=0)
    broken = tmp_path / "broken"
    shutil.copytree(corpus, broken)
    first = json.loads((broken / "manifest.jsonl").read_text().splitlines()[0])["task"]
    (broken / "tasks" / f"{first}.json").unlink()
    with pytest.raises(CorpusError, match=f"manifest.jsonl line 1: field 'task': {first} has no labelled task file"):
        mix.training_tasks(broken)


def test_training_traces_selects_the_mix(real, corpus, arc_data, tmp_path):
    from training.traces import parse_args, select_tasks

    config = tmp_path / "rft.toml"
    config.write_text(f'base = "b"\nrows = "r"\nout = "o"\n[corpus]\ndir = "{corpus}"\nfraction = 0.5\nseed = 3\n')
    common = ["--model", "m", "--tasks", str(arc_data / "arc-agi-2" / "training"), "--out", "t.jsonl",
              "--max-tasks", "4"]
    tasks = select_tasks(parse_args(common + ["--config", str(config)]))
    assert len(tasks) == 8 and len({t.id for t in tasks} & corpus_ids(corpus)) == 4
    # an option on the command line wins over the table
    tasks = select_tasks(parse_args(common + ["--config", str(config), "--corpus-fraction", "0.2"]))
    assert len(tasks) == 5 and len({t.id for t in tasks} & corpus_ids(corpus)) == 1


def test_calibration_traces_mix_the_corpus_in(corpus, arc_data, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from build.models.tiny import make_tokenizer
    from training.calibration_traces import main

    model = tmp_path / "m"
    make_tokenizer(model)  # --thinking 0 reads only the tokenizer
    out = tmp_path / "traces.jsonl"
    common = ["--model", str(model), "--tasks", str(arc_data / "arc-agi-2" / "training"), "--max-tasks", "4",
              "--thinking", "0", "--out", str(out)]
    main(common)
    alone = [json.loads(line)["task_id"] for line in out.read_text().splitlines()]
    assert len(alone) == 4 and not set(alone) & corpus_ids(corpus)
    main(common + ["--corpus", str(corpus), "--corpus-fraction", "0.5", "--corpus-seed", "1"])
    traces = [json.loads(line) for line in out.read_text().splitlines()]
    ids = [t["task_id"] for t in traces]
    assert len(ids) == 8 and sorted(set(ids) - corpus_ids(corpus)) == sorted(alone)
    assert len(set(ids) & corpus_ids(corpus)) == 4
    for trace in traces:
        p, t = trace["segments"]["thinking"]
        assert p == t and trace["segments"]["answer"][1] == len(trace["token_ids"])
    with pytest.raises(CorpusError, match=re.escape(f"{corpus / 'heldout'}: a corpus's heldout/ folder")):
        main(common + ["--corpus", str(corpus / "heldout"), "--corpus-fraction", "0.5"])


def test_grid_tune_rows_mix_the_corpus(corpus, arc_data):
    from training.grid_tune import build_rows

    training = arc_data / "arc-agi-2" / "training"
    alone = build_rows([training], [], 8192, 2)
    rows = build_rows([training], [], 8192, 2, CorpusMix(str(corpus), 0.5, seed=0))
    made = corpus_ids(corpus)
    assert {r.task_id for r in rows} - made == {r.task_id for r in alone} and len(alone) == 2 * 16
    assert len({r.task_id for r in rows} & made) == 2
    assert len(rows) == 4 * 16  # every corpus task in its 16 views too


@pytest.mark.usefixtures("one_torch_thread")
def test_grid_tune_takes_the_corpus_options(corpus, arc_data, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from build.models.grid_vocab import cut
    from build.models.tiny import make_checkpoint
    from training.dataset import read_rows
    from training.grid_tune import main

    grid = cut(make_checkpoint(tmp_path / "base", "qwen3", seed=5), tmp_path / "grid")
    out = tmp_path / "tune"
    main(["--model", str(grid), "--tasks", str(arc_data / "arc-agi-2" / "training"), "--max-tasks", "1",
          "--out", str(out), "--steps", "1", "--rank", "4", "--max-len", "2048", "--corpus", str(corpus),
          "--corpus-fraction", "0.5"])
    ids = {r.task_id for r in read_rows(out / "rows.jsonl")}
    assert len(ids) == 2 and len(ids & corpus_ids(corpus)) == 1
