"""The grid line's formats read from the checkpoint (issue 29 section 1): NVARC's published layout and tokenizer
(tests/nvarc_tokenizer, from github 1ytic/NVARC) beside the kit's own 16 tokens.

NVARC's `QwenFormatter` and completion-only collator (ARC-AGI1/002_ivan_arc1.ipynb) are copied below as the
reference: the kit's `nvarc` sequences must be the ids NVARC's own text gives under its own tokenizer, with the loss
where NVARC's collator puts it. A checkpoint whose tokenizer lacks a token of its format is refused, naming the
token, before any weight is loaded.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from submission.grid.dfs import greedy, search
from submission.grid.format import (KIT16, FormatError, GridState, answer_ids, decode_grid, decode_sequence, encode,
                                    read_format)
from submission.tasks import load_tasks

pytest.importorskip("tokenizers")

NVARC_FILES = Path(__file__).parent / "nvarc_tokenizer"


def nvarc_checkpoint(folder: Path, vocab_size: int = 16, drop: str | None = None) -> Path:
    """NVARC's tokenizer files as published (one vocabulary entry dropped if asked) and a config.json."""
    folder.mkdir(parents=True, exist_ok=True)
    for path in NVARC_FILES.glob("*.json*"):
        shutil.copy(path, folder)
    if drop is not None:
        tokenizer = json.loads((folder / "tokenizer.json").read_text())
        del tokenizer["model"]["vocab"][drop]
        (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    config = folder / "config.json"
    if not config.exists():
        config.write_text(json.dumps({"model_type": "qwen3", "vocab_size": vocab_size}))
    return folder


@pytest.fixture(scope="module")
def nvarc(tmp_path_factory):
    return read_format(nvarc_checkpoint(tmp_path_factory.mktemp("nvarc")), "nvarc")


# --- NVARC's formatter and collator, as published (ARC-AGI1/002_ivan_arc1.ipynb), for reference ---------------
def convert_grid_to_string(grid) -> str:
    text = ""
    for row in grid:
        for cell in row:
            text += str(int(cell))
        text += "\n"
    return text.strip()


def fmt_query(grid_input) -> str:
    return "<|im_start|>user\n" + convert_grid_to_string(grid_input) + "<|im_end|><|im_start|>assistant\n"


def fmt_train(train) -> str:
    text = ""
    for x in train:
        grid_input = convert_grid_to_string(x.input)
        grid_output = convert_grid_to_string(x.output)
        text += f"<|im_start|>user\n{grid_input}<|im_end|><|im_start|>assistant\n{grid_output}<|im_end|>"
    return text


def collator_labels(ids: list[int]) -> list[bool]:
    """Where QwenDataCollatorForCompletionOnlyLM keeps the labels (USER 11, ASSISTANT 12, EOS 15)."""
    labels = np.array(ids)
    start_idx = sorted(np.where(labels == 11)[0].tolist() + np.where(labels == 12)[0].tolist())
    end_idx = np.where(labels == 15)[0]
    keep = [False] * len(ids)
    for j, (start, end) in enumerate(zip(start_idx, end_idx)):
        if j % 2 == 1:
            keep[start + 2:end + 1] = [True] * (end + 1 - start - 2)
    return keep
# -----------------------------------------------------------------------------------------------------------------


def test_nvarc_ids_are_read_from_its_published_tokenizer(nvarc):
    """The ids NVARC's solver hard-codes (ARC_VOCAB, USER_TOKEN_ID 11, ASSISTANT_TOKEN_ID 12, PAD_ID 13, EOS_ID 15),
    found in its tokenizer files rather than written here."""
    assert nvarc.colours == tuple(range(10)) and nvarc.newline == 10
    assert (nvarc.eos, nvarc.pad, nvarc.start) == (15, 13, ())
    assert nvarc.input_head == (14, 11, 10) and nvarc.output_head == (15, 14, 12, 10)


def test_sequences_are_nvarcs_text_under_nvarcs_tokenizer(nvarc, arc_data):
    """Training sequences, prompts and rescored answers: the ids of NVARC's formatter's text, the loss where its
    collator puts it, for the first 50 ARC-AGI-2 training tasks."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(NVARC_FILES / "tokenizer.json"))
    for task in load_tasks(arc_data / "arc-agi-2" / "training").tasks[:50]:
        trained = encode(task.train, max_len=1 << 20, fmt=nvarc)
        assert list(trained.ids) == tokenizer.encode(fmt_train(task.train), add_special_tokens=False).ids, task.id
        assert list(trained.output_mask) == collator_labels(list(trained.ids)), task.id
        prompt = encode(task.train, task.test_inputs[0], max_len=1 << 20, fmt=nvarc)
        text = fmt_train(task.train) + fmt_query(task.test_inputs[0])
        assert list(prompt.ids) == tokenizer.encode(text, add_special_tokens=False).ids, task.id
        reply = convert_grid_to_string(task.test_outputs[0]) + "<|im_end|>"
        assert answer_ids(task.test_outputs[0], nvarc) == tokenizer.encode(reply, add_special_tokens=False).ids


def test_every_training_task_round_trips_through_nvarc_ids(nvarc, arc_data):
    rng = random.Random(0)
    for task in load_tasks(arc_data / "arc-agi-2" / "training").tasks:
        index = rng.randrange(len(task.test_inputs))
        encoded = encode(task.train, task.test_inputs[index], task.test_outputs[index], max_len=1 << 20, fmt=nvarc)
        expected = [(p.input, p.output) for p in task.train] + [(task.test_inputs[index], task.test_outputs[index])]
        assert decode_sequence(encoded.ids, nvarc) == expected, task.id
        assert decode_grid(answer_ids(task.test_outputs[index], nvarc), nvarc) == task.test_outputs[index]


@pytest.mark.parametrize("which", ["kit16", "nvarc"])
def test_the_grammar_admits_exactly_the_grids(which, nvarc):
    """Up to 2x2, the sequences the search's grammar admits are exactly every grid's answer ids, in either format
    (NVARC's: no newline after the last row, so a row is ended by the next newline or by <|im_end|>)."""
    fmt = KIT16 if which == "kit16" else nvarc
    admitted, stack = set(), [(GridState(), ())]
    while stack:
        state, seq = stack.pop()
        for token in state.legal(2, fmt):
            child = state.advance(token, fmt)
            (admitted.add if child.done else lambda s: stack.append((child, s)))((*seq, token))
    grids = [tuple(tuple(cells[r * w:(r + 1) * w]) for r in range(h))
             for h, w in itertools.product((1, 2), (1, 2)) for cells in itertools.product(range(10), repeat=h * w)]
    assert admitted == {tuple(answer_ids(g, fmt)) for g in grids}
    assert len(admitted) == 10_210


class OracleStepper:
    """A model that knows two answers (0.6 and 0.4) in the format it is given: the next token's probability is the
    answers' weight that continues the tokens so far, a little left for every other token."""

    def __init__(self, answers: dict[tuple[int, ...], float], vocab: int = 16):
        self.answers, self.vocab, self.tokens, self.base = answers, vocab, [], 0

    @property
    def length(self) -> int:
        return self.base + len(self.tokens)

    def _logp(self) -> np.ndarray:
        p = np.full(self.vocab, 1e-6)
        n = len(self.tokens)
        for ids, weight in self.answers.items():
            if len(ids) > n and list(ids[:n]) == self.tokens:
                p[ids[n]] += weight
        return np.log(p / p.sum()).astype(np.float32)

    def prefill(self, ids, guess=()):
        """Stepper.prefill: the log-probabilities after `ids` and after each guess token, one row each."""
        self.base, self.tokens = len(ids), []
        rows = [self._logp()]
        for token in guess:
            rows.append(self.push(token))
        return rows

    def push(self, token):
        self.tokens.append(token)
        return self._logp()

    def truncate(self, length):
        del self.tokens[length - self.base:]


def test_the_search_finds_the_same_grids_through_both_formats(nvarc, arc_data):
    """The same task, the same model knowledge: the search, the greedy fallback and the answer parse give the same
    grids (and the same probabilities) whether the checkpoint speaks kit16 or NVARC's layout."""
    task = load_tasks(arc_data / "arc-agi-2" / "training").tasks[0]
    first, second = task.test_outputs[0], tuple(tuple((c + 1) % 10 for c in row) for row in task.test_outputs[0])
    results = {}
    for fmt in (KIT16, nvarc):
        stepper = OracleStepper({tuple(answer_ids(first, fmt)): 0.6, tuple(answer_ids(second, fmt)): 0.4})
        prompt = encode(task.train, task.test_inputs[0], max_len=8192, fmt=fmt).ids
        found = search(stepper, prompt, 0.2, fmt=fmt)
        best = greedy(stepper, prompt, fmt=fmt)
        results[fmt.name] = ([(decode_grid(f.tokens, fmt), f.logp) for f in found.found],
                             decode_grid(best.tokens, fmt))
    (kit_found, kit_best), (nvarc_found, nvarc_best) = results["kit16"], results["nvarc"]
    assert [g for g, _ in kit_found] == [g for g, _ in nvarc_found] == [first, second]
    assert kit_best == nvarc_best == first
    assert all(math.isclose(a, b, abs_tol=1e-3) for (_, a), (_, b) in zip(kit_found, nvarc_found))


def test_a_tokenizer_without_a_token_is_refused_naming_it(tmp_path, nvarc):
    with pytest.raises(FormatError, match=r"tokenizer.json: format 'nvarc' needs the token '7' as one id"):
        read_format(nvarc_checkpoint(tmp_path / "no-seven", drop="7"), "nvarc")
    with pytest.raises(FormatError, match=r"format 'nvarc' needs the token 'assistant'"):
        read_format(nvarc_checkpoint(tmp_path / "no-assistant", drop="assistant"), "nvarc")
    with pytest.raises(FormatError, match=r"format 'kit16' needs the token '<eos>'"):
        read_format(nvarc_checkpoint(tmp_path / "as-kit16"), "kit16")
    with pytest.raises(FormatError, match=r"'<\|im_end\|>' is id 15, outside the model's vocab_size 12"):
        read_format(nvarc_checkpoint(tmp_path / "small", vocab_size=12), "nvarc")
    with pytest.raises(FormatError, match="cannot read the tokenizer"):
        read_format(tmp_path / "nothing", "nvarc")


def test_the_run_refuses_a_checkpoint_without_the_token_before_any_worker(tmp_path, arc_data, capsys):
    """No weights in the folder at all: the refusal comes from the tokenizer, before a worker would load them."""
    from submission.grid.main import main

    profile = tmp_path / "grid-nvarc.toml"
    text = (Path(__file__).parent.parent / "profiles" / "grid-tiny.toml").read_text()
    profile.write_text(text.replace('format = "kit16"', 'format = "nvarc"'))
    model = nvarc_checkpoint(tmp_path / "model", drop="3")
    code = main(["--tasks", str(arc_data / "arc-agi-2" / "evaluation"), "--max-tasks", "1", "--profile", str(profile),
                 "--model", str(model), "--out", str(tmp_path / "out" / "submission.json")])
    assert code == 2
    assert "needs the token '3' as one id" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_profile_names_a_known_format(tmp_path):
    from submission.profiles import ProfileError, load_grid_profile

    path = tmp_path / "grid-x.toml"
    path.write_text('line = "grid"\n[model]\nformat = "kit32"\n')
    with pytest.raises(ProfileError, match="model.format must be one of kit16, nvarc, not 'kit32'"):
        load_grid_profile(path)
    assert load_grid_profile("grid-tiny").model.format == "kit16"


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("tuned", [False, True], ids=["fresh-lora", "adapter"])
def test_a_tiny_checkpoint_with_nvarcs_tokenizer_solves_a_task(tmp_path, arc_data, tuned):
    """A random-weight tiny Qwen3 with NVARC's tokenizer files (make grid-dry-run GRID_FORMAT=nvarc's checkpoint):
    TTT, search and rescoring run through the `nvarc` format and answer every test input with a grid (random
    weights: which grids is not the point); with `tuned`, on an adapter training.grid_tune trained through the same
    format, loaded as it is (--adapter, model.load_adapter), as the dry run does."""
    pytest.importorskip("peft")
    from build.models.grid_vocab import cut
    from build.models.tiny import make_checkpoint
    from submission.grid.model import load_adapter
    from submission.grid.queue import task_cost
    from submission.grid.solve import solve_task
    from submission.profiles import load_grid_profile
    from training.grid_tune import main as tune

    kit = cut(make_checkpoint(tmp_path / "base", "qwen3", seed=5), tmp_path / "kit")
    folder = tmp_path / "nvarc"
    shutil.copytree(kit, folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)
    nvarc_checkpoint(folder)
    profile = load_grid_profile("grid-tiny")
    profile = replace(profile, model=replace(profile.model, path=str(folder), format="nvarc"),
                      ttt=replace(profile.ttt, sequences=2), rescore=replace(profile.rescore, views=1),
                      search=replace(profile.search, dihedrals=1, colour_perms=2, views_per_batch=2, dfs_batch=2,
                                     batch_s=2.0, max_side=4))
    if tuned:
        assert tune(["--model", str(folder), "--format", "nvarc", "--tasks", str(arc_data / "arc-agi-2" / "training"),
                     "--max-tasks", "1", "--out", str(tmp_path / "tune"), "--steps", "2", "--rank", "4",
                     "--max-len", "2048"]) == 0
        profile = replace(profile, model=replace(profile.model, adapter=str(tmp_path / "tune" / "adapter")))
    fmt = read_format(folder, "nvarc")
    task = min(load_tasks(arc_data / "arc-agi-2" / "evaluation").tasks, key=task_cost)
    adapter = load_adapter(profile.model, profile.ttt)
    ranks = {r for m in adapter.model.modules() if hasattr(m, "lora_A") for r in m.r.values()}
    assert ranks == {4 if tuned else profile.ttt.rank}  # a loaded adapter keeps its own shape
    outcome = solve_task(adapter, task, profile, 2048, 20.0, fmt=fmt)
    assert outcome.ttt_steps == 2 and len(outcome.candidates) == len(task.test_inputs)
    for candidates in outcome.candidates:
        assert candidates and all(len({len(row) for row in c.grid}) == 1 for c in candidates)


def test_the_kits_cut_reads_as_kit16_and_nvarcs_checkpoint_is_not_cut_again(tmp_path):
    """build.models.grid_vocab's tokenizer gives the kit16 ids the kit has always used; NVARC's checkpoint, already cut,
    is pointed at its format instead of failing on 'I' (issue 29)."""
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from build.models.grid_vocab import make_tokenizer, source_ids

    make_tokenizer().save_pretrained(tmp_path / "kit")
    (tmp_path / "kit" / "config.json").write_text(json.dumps({"vocab_size": 16}))
    assert read_format(tmp_path / "kit", "kit16") == KIT16
    with pytest.raises(FormatError, match="format 'nvarc' needs the token"):
        read_format(tmp_path / "kit", "nvarc")
    with pytest.raises(ValueError, match="token 'I' .* model.format = \"nvarc\""):
        source_ids(AutoTokenizer.from_pretrained(nvarc_checkpoint(tmp_path / "nvarc")))


def test_the_format_flag_overrides_the_profile(tmp_path, arc_data, capsys):
    """`--format nvarc` (make grid-dry-run GRID_FORMAT=nvarc) on a kit16 tokenizer is refused, naming NVARC's token."""
    pytest.importorskip("transformers")
    from build.models.grid_vocab import make_tokenizer
    from submission.grid.main import main

    make_tokenizer().save_pretrained(tmp_path / "kit")
    (tmp_path / "kit" / "config.json").write_text(json.dumps({"vocab_size": 16}))
    code = main(["--tasks", str(arc_data / "arc-agi-2" / "evaluation"), "--max-tasks", "1", "--format", "nvarc",
                 "--model", str(tmp_path / "kit"), "--out", str(tmp_path / "out" / "submission.json")])
    assert code == 2 and "needs the token '<|im_end|>' as one id" in capsys.readouterr().err
