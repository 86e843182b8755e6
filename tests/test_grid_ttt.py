"""Per-task test-time training on a tiny grid model: the augmented sequences, the loss falls, the reset is exact."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from submission.grid.format import decode_sequence  # noqa: E402
from submission.grid.queue import task_cost  # noqa: E402
from submission.grid.ttt import Adapter, TTTConfig, training_sequences  # noqa: E402
from submission.tasks import load_tasks  # noqa: E402
from submission.views import dihedral  # noqa: E402


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def grid_model(tmp_path_factory):
    from build.grid_vocab import cut
    from build.tiny import make_checkpoint

    root = tmp_path_factory.mktemp("grid-ttt")
    return cut(make_checkpoint(root / "base", "qwen3", seed=2), root / "grid")


@pytest.fixture(scope="module")
def task(arc_data):
    return min(load_tasks(arc_data / "arc-agi-2" / "training").tasks, key=task_cost)


def _recolouring(a, b) -> dict | None:
    """The colour map that turns grid a into grid b, if one consistent bijection does."""
    if len(a) != len(b) or len(a[0]) != len(b[0]):
        return None
    forward: dict = {}
    for x, y in zip((c for row in a for c in row), (c for row in b for c in row)):
        if forward.setdefault(x, y) != y:
            return None
    return forward if len(set(forward.values())) == len(forward) else None


def test_the_128_sequences_are_8_transforms_by_16_colour_permutations(task):
    sequences = training_sequences(task, TTTConfig(), max_len=8192)
    assert len(sequences) == 128 and sequences == training_sequences(task, TTTConfig(), max_len=8192)
    assert len({s.ids for s in sequences}) == 128
    moved = 0
    for i, s in enumerate(sequences):  # sequence i shows every demonstration under dihedral transform i % 8
        pairs = decode_sequence(s.ids)
        assert len(pairs) == len(task.train)
        for shown_in, shown_out in pairs:
            assert any(_recolouring(dihedral(p.input, i % 8), shown_in) is not None
                       and _recolouring(dihedral(p.output, i % 8), shown_out) is not None for p in task.train)
        recolour = _recolouring(dihedral(task.train[0].input, i % 8), pairs[0][0])
        moved += recolour is not None and recolour.get(0, 0) != 0
    assert moved > 0  # all ten colours move, black included
    assert training_sequences(task, TTTConfig(sequences=8), max_len=8192) == sequences[:8]


def _mean_loss(model, sequences) -> float:
    total = 0.0
    with torch.no_grad():
        for s in sequences:
            ids = torch.tensor([s.ids])
            labels = ids.masked_fill(~torch.tensor([s.output_mask]), -100)
            total += float(model(input_ids=ids, labels=labels).loss)
    return total / len(sequences)


def test_loss_falls_and_reset_restores_the_fresh_adapter(grid_model, task):
    from submission.grid.model import load_model

    torch.manual_seed(0)
    config = TTTConfig(rank=8, sequences=16, lr=2e-3)
    adapter = Adapter(load_model(grid_model, "float32"), config)
    sequences = training_sequences(task, config, max_len=2048)
    probe = torch.tensor([sequences[0].ids])
    with torch.no_grad():
        fresh = adapter.model(input_ids=probe).logits.clone()
    before = _mean_loss(adapter.model, sequences)
    report = adapter.train(sequences)
    after = _mean_loss(adapter.model, sequences)
    assert report.steps == report.planned == 16
    assert after < 0.85 * before, (before, after)
    adapter.reset()
    with torch.no_grad():
        assert torch.equal(adapter.model(input_ids=probe).logits, fresh)
    # a second task trains from the same start: the same sequences give the same losses
    again = adapter.train(sequences[:1])
    assert again.losses[0] == pytest.approx(report.losses[0], rel=1e-5)


def test_training_stops_at_its_deadline(grid_model, task):
    from submission.grid.model import load_model

    adapter = Adapter(load_model(grid_model, "float32"), TTTConfig(rank=4, sequences=16))
    ticks = iter(range(1000))
    report = adapter.train(training_sequences(task, TTTConfig(rank=4, sequences=16), 2048), deadline=4,
                           clock=lambda: next(ticks))
    assert report.planned == 16 and 0 < report.steps < 16
