"""Continued fine-tuning of the grid model: rows from real labelled tasks, the loss falls, a session resumes at its
checkpoint, the merge gives a grid model the solver loads; the rows go through the checkpoint's own format (NVARC's
tokenizer included), and the adapter and optimiser state stay in the model's dtype (issue 29)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from submission.grid.format import decode_sequence, read_format  # noqa: E402
from submission.grid.queue import task_cost  # noqa: E402
from submission.tasks import load_tasks  # noqa: E402
from training.dataset import IGNORE, read_rows  # noqa: E402
from training.grid_tune import build_rows, main, task_rows  # noqa: E402

NVARC_FILES = Path(__file__).parent / "nvarc_tokenizer"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def grid_model(tmp_path_factory):
    from build.models.grid_vocab import cut
    from build.models.tiny import make_checkpoint

    root = tmp_path_factory.mktemp("grid-tune")
    return cut(make_checkpoint(root / "base", "qwen3", seed=5), root / "grid")


def test_rows_append_the_test_pairs_in_16_views(arc_data):
    task = min(load_tasks(arc_data / "arc-agi-2" / "training").tasks, key=task_cost)
    rows = task_rows(task, max_len=8192)
    assert len(rows) == 16 and len({tuple(r.input_ids) for r in rows}) == 16
    for row in rows:
        pairs = decode_sequence(row.input_ids)
        assert len(pairs) == len(task.train) + len(task.test_inputs)
        supervised = sum(label != IGNORE for label in row.labels)
        assert supervised == sum(len(out) * (len(out[0]) + 1) + 1 for _, out in pairs)


def nvarc_cut(grid_model: Path, folder: Path, drop: str | None = None) -> Path:
    """The kit's tiny cut with NVARC's published tokenizer files in place of its own, as make grid-dry-run
    GRID_FORMAT=nvarc makes it (one vocabulary entry dropped if asked)."""
    shutil.copytree(grid_model, folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)
    for path in NVARC_FILES.glob("*.json"):
        shutil.copy(path, folder)
    if drop is not None:
        tokenizer = json.loads((folder / "tokenizer.json").read_text())
        del tokenizer["model"]["vocab"][drop]
        (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    return folder


def test_rows_go_through_the_checkpoints_format(grid_model, arc_data, tmp_path):
    """--format nvarc on a checkpoint with NVARC's tokenizer: the rows are NVARC's layout in its tokenizer's ids,
    the loss on every output grid and its <|im_end|> (no newline after the last row)."""
    folder = nvarc_cut(grid_model, tmp_path / "nvarc")
    nvarc = read_format(folder, "nvarc")
    training = arc_data / "arc-agi-2" / "training"
    out = tmp_path / "tune"
    main(["--model", str(folder), "--format", "nvarc", "--tasks", str(training), "--max-tasks", "1", "--out",
          str(out), "--steps", "1", "--rank", "4", "--max-len", "2048"])
    rows = read_rows(out / "rows.jsonl")
    assert rows == build_rows([training], [], 2048, 1, fmt=nvarc) and rows != build_rows([training], [], 2048, 1)
    for row in rows:
        pairs = decode_sequence(row.input_ids, nvarc)
        supervised = sum(label != IGNORE for label in row.labels)
        assert supervised == sum(len(answer) * (len(answer[0]) + 1) for _, answer in pairs)
    assert (out / "adapter" / "adapter_config.json").is_file()


def test_a_checkpoint_that_cannot_write_the_format_is_refused_before_any_work(grid_model, arc_data, tmp_path,
                                                                               capsys):
    """As the run refuses it (submission.grid.run): the token named, nothing written. The format comes from
    --format, else --profile's model.format, else kit16."""
    common = ["--tasks", str(arc_data / "arc-agi-2" / "training"), "--max-tasks", "1", "--steps", "1"]
    assert main(common + ["--model", str(grid_model), "--format", "nvarc", "--out", str(tmp_path / "a")]) == 2
    assert "needs the token '<|im_end|>' as one id" in capsys.readouterr().err
    profile = tmp_path / "grid-nvarc.toml"
    text = (Path(__file__).parent.parent / "profiles" / "grid-tiny.toml").read_text()
    profile.write_text(text.replace('format = "kit16"', 'format = "nvarc"'))
    assert main(common + ["--model", str(grid_model), "--profile", str(profile), "--out", str(tmp_path / "b")]) == 2
    assert "needs the token '<|im_end|>' as one id" in capsys.readouterr().err
    no_seven = nvarc_cut(grid_model, tmp_path / "no-seven", drop="7")
    assert main(common + ["--model", str(no_seven), "--format", "nvarc", "--out", str(tmp_path / "c")]) == 2
    assert f"{no_seven / 'tokenizer.json'}: format 'nvarc' needs the token '7' as one id" in capsys.readouterr().err
    assert not any((tmp_path / name).exists() for name in "abc")
    made = tmp_path / "made"  # rows made in kit16 (a resumed run keeps its rows): not trained on as nvarc
    made.mkdir()
    (made / "rows.jsonl").write_text("")
    (made / "grid_format.json").write_text(json.dumps({"format": "kit16"}))
    nvarc = nvarc_cut(grid_model, tmp_path / "nvarc")
    assert main(common + ["--model", str(nvarc), "--format", "nvarc", "--out", str(made)]) == 2
    assert f"{made / 'grid_format.json'}: field 'format' is 'kit16', this run's is 'nvarc'" in capsys.readouterr().err


def test_adapter_and_optimiser_state_stay_in_bf16_and_the_run_loads_the_adapter(grid_model, arc_data, tmp_path):
    """PEFT's default upcasts a bf16 model's adapters (and so AdamW's state) to float32, 1.4x slower on an L4's
    float32 path; the tuning keeps them bf16 as TTT does, in the first session and after a resume, and the run
    loads the adapter it saves as it is."""
    from safetensors.torch import load_file

    from submission.grid.profile import ModelConfig
    from submission.grid.model import load_adapter
    from submission.grid.ttt import TTTConfig

    out = tmp_path / "tune"
    common = ["--model", str(grid_model), "--tasks", str(arc_data / "arc-agi-2" / "training"), "--max-tasks", "1",
              "--out", str(out), "--steps", "2", "--checkpoint-every", "1", "--rank", "4", "--max-len", "2048",
              "--dtype", "bfloat16"]
    for session in (["--session-steps", "1"], []):  # the second session resumes from the first's checkpoint
        main(common + session)
        state = torch.load(out / "checkpoint" / "state.pt", weights_only=False)
        moments = {v.dtype for s in state["optimizer"]["state"].values() for v in s.values() if v.dim()}
        assert moments == {torch.bfloat16}, session
    saved = load_file(out / "adapter" / "adapter_model.safetensors")
    assert saved and {t.dtype for t in saved.values()} == {torch.bfloat16}
    loaded = load_adapter(ModelConfig(str(grid_model), "bfloat16", adapter=str(out / "adapter")), TTTConfig(rank=8))
    trained = {n: p for n, p in loaded.model.named_parameters() if p.requires_grad}
    assert {p.dtype for p in trained.values()} == {torch.bfloat16}
    assert {m.r["default"] for m in loaded.model.modules() if hasattr(m, "lora_A")} == {4}  # its own shape


def test_loss_falls_resumes_and_merges(grid_model, arc_data, tmp_path, capsys):
    from submission.grid.model import load_model

    out = tmp_path / "tune"
    tasks = str(arc_data / "arc-agi-2" / "training")
    common = ["--model", str(grid_model), "--tasks", tasks, "--max-tasks", "1", "--out", str(out), "--steps", "24",
              "--checkpoint-every", "4", "--rank", "8", "--lr", "3e-3", "--max-len", "2048"]
    main(common + ["--session-steps", "8"])  # a session that ends early, at a checkpoint
    first = json.loads((out / "losses.json").read_text())
    assert len(first) == 8 and not (out / "adapter").exists()
    main(common)
    assert "resuming at step 8 of 24" in capsys.readouterr().err
    losses = json.loads((out / "losses.json").read_text())
    assert len(losses) == 24 and losses[:8] == first
    assert (out / "loss.png").stat().st_size > 0
    main(["--model", str(grid_model), "--out", str(out), "--merge"])
    merged = load_model(out / "merged", "float32")
    assert merged.config.vocab_size == 16 and (out / "merged" / "tokenizer.json").exists()
    # the loss falls: the merged model against the base on the training rows
    rows = read_rows(out / "rows.jsonl")
    before, after = _mean_loss(load_model(grid_model, "float32"), rows), _mean_loss(merged, rows)
    assert after < 0.9 * before, (before, after)  # measured: 2.79 -> 2.44 (random weights, 24 steps)
    # the adapter as saved is what the run loads (issue 29): on the base it computes what the merged model does
    from submission.grid.profile import ModelConfig
    from submission.grid.model import load_adapter
    from submission.grid.ttt import TTTConfig

    loaded = load_adapter(ModelConfig(str(grid_model), "float32", adapter=str(out / "adapter")), TTTConfig(rank=4))
    ids = torch.tensor([rows[0].input_ids])
    with torch.no_grad():
        assert torch.allclose(loaded.model(input_ids=ids).logits, merged(input_ids=ids).logits, atol=1e-4)


def test_unsloth_backend_trains_an_adapter_the_merge_and_solver_load(grid_model, arc_data, tmp_path):
    """In the unsloth environment only (make test runs it there): the same rows, the same LoRA shape through
    unsloth; its adapter merges with plain PEFT and the loss falls as with the peft backend."""
    pytest.importorskip("unsloth")
    from submission.grid.model import load_model

    out = tmp_path / "tune-unsloth"
    main(["--model", str(grid_model), "--tasks", str(arc_data / "arc-agi-2" / "training"), "--max-tasks", "1",
          "--out", str(out), "--steps", "24", "--checkpoint-every", "24", "--rank", "8", "--lr", "3e-3",
          "--max-len", "2048", "--backend", "unsloth"])
    assert len(json.loads((out / "losses.json").read_text())) == 24
    main(["--model", str(grid_model), "--out", str(out), "--merge"])
    merged = load_model(out / "merged", "float32")
    rows = read_rows(out / "rows.jsonl")
    before, after = _mean_loss(load_model(grid_model, "float32"), rows), _mean_loss(merged, rows)
    assert after < 0.9 * before, (before, after)


def _mean_loss(model, rows) -> float:
    with torch.no_grad():
        return sum(float(model(input_ids=torch.tensor([r.input_ids]), labels=torch.tensor([r.labels])).loss)
                   for r in rows) / len(rows)
