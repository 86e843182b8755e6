"""Grid-line profiles: one TOML file (profiles/grid-*.toml) with `line = "grid"`, validated like every profile.

    line = "grid"
    [model]    checkpoint (made by build.models.grid_vocab), dtype, format, adapter  (ModelConfig)
    [ttt]      per-task test-time training                             (submission.grid.ttt.TTTConfig)
    [search]   views, cut-off and time per batch of the search         (SearchConfig)
    [rescore]  fresh views for the rescoring                           (RescoreConfig)
    [run]      workers, their devices and contexts, time limits        (RunConfig)
    [build]    the bundle's wheel target                               (GridBuildConfig)

Read and written by submission.profiles (unknown sections and keys refused with the file, section and key).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from submission.grid.format import LAYOUTS
from submission.grid.ttt import TTTConfig


def _interp(x: float, xs: tuple[float, ...] | list[float], ys: tuple[float, ...] | list[float]) -> float:
    """Piecewise-linear through (xs, ys), flat beyond the ends (numpy.interp's rule). Pure Python: the preflight
    imports this module on a bare interpreter before the wheels (numpy among them) are installed."""
    if x <= xs[0]:
        return float(ys[0])
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x <= x1:
            return float(y0 + (y1 - y0) * (x - x0) / (x1 - x0))
    return float(ys[-1])


@dataclass(frozen=True)
class ModelConfig:
    path: str = ""  # checkpoint folder; --model overrides it
    dtype: str = "bfloat16"
    # the grid layout the checkpoint was trained on (submission.grid.format.LAYOUTS): "kit16", build.models.grid_vocab's
    # cut; "nvarc", NVARC's published Qwen3 4B. Its token ids are read from the checkpoint's tokenizer at load.
    format: str = "kit16"
    adapter: str = ""  # PEFT adapter folder loaded on the base per worker (training.grid_tune's out/adapter); --adapter
    merge: bool = False  # merge the adapter into the base and train a fresh LoRA per task instead; --merge
    backend: str = "auto"  # the training's: unsloth (its kernels) where its environment is installed, else peft

    def __post_init__(self) -> None:
        if self.format not in LAYOUTS:
            raise ValueError(f"model.format must be one of {', '.join(LAYOUTS)}, not {self.format!r}")
        if self.backend not in ("auto", "peft", "unsloth"):
            raise ValueError(f"model.backend must be auto, peft or unsloth, got {self.backend!r}")

    def adapter_dir(self) -> str:
        """The adapter's folder, "" for none. A relative `adapter` lies inside the checkpoint folder: that is how a
        bundle carries one (model/adapter, build.bundle --adapter), found wherever boot mounts the model."""
        if not self.adapter or Path(self.adapter).is_absolute():
            return self.adapter
        return str(Path(self.path) / self.adapter)


@dataclass(frozen=True)
class SearchConfig:
    cutoff: float = 0.2  # keep branches whose cumulative probability stays >= this
    dihedrals: int = 8
    colour_perms: int = 2  # 8 x 2 = 16 views per test input
    views_per_batch: int = 4
    batch_s: float = 540.0  # search time per batch of views, at most
    max_side: int = 30  # the grammar's bound on rows and columns
    preload: bool = False  # prefill a batch's (or a dfs_batch group's) prompts in one model call
    dfs_batch: int = 1  # views of a batch searched in lockstep, one model call per step for all; 1 = view by view
    guess: bool = True  # seed each view with its input's best answer so far (dfs.search's guess); false: unseeded

    def __post_init__(self) -> None:
        if not 0 < self.cutoff <= 1:
            raise ValueError(f"search.cutoff must be in (0, 1], got {self.cutoff}")
        if not 1 <= self.dfs_batch <= self.views_per_batch:
            raise ValueError(f"search.dfs_batch must be between 1 and search.views_per_batch "
                             f"({self.views_per_batch}), got {self.dfs_batch}")


@dataclass(frozen=True)
class RescoreConfig:
    views: int = 8
    share: float = 0.25  # of each test input's time, kept from the search for the rescoring
    seed: int = 0  # with the task id, seeds every view of the search, the rescoring and the training
    batch: int = 1  # sequences (views x candidates) per model call; whole views per call; 1 = one at a time

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise ValueError(f"rescore.batch must be at least 1, got {self.batch}")


@dataclass(frozen=True)
class RunConfig:
    devices: tuple[str, ...] = ("cuda:0", "cuda:1", "cuda:2", "cuda:3")  # one worker each
    max_len: tuple[int, ...] = (8192,)  # context per worker (the last value repeats)
    threads: int = 0  # torch CPU threads per worker; 0 = torch's default
    time_limit_s: float = 12 * 3600
    hard_stop_margin_s: float = 7 * 60  # the run ends this long before the limit
    stop_new_margin_s: float = 15 * 60  # no task starts later than this before the limit
    min_task_s: float = 1200.0  # each task's time limit, from the remaining budget and queue, clamped to these
    max_task_s: float = 3000.0
    max_failures: int = 3  # consecutive failed tasks after which a worker exits
    respawns: int = 2  # restarts of a dead or stuck worker's process on its device, per worker; then it is retired
    # A task's budget by its size (issue 29): the seconds a whole task and its test-time training take on this line's
    # GPU at the task sizes `size_tokens` (queue.task_cost: prompt tokens x test inputs; linear between, flat beyond).
    # A task's time limit is its `task_s` times the share of the remaining budget that the queue's `task_s` leaves;
    # its training takes `ttt_s / task_s` of its limit (instead of ttt.share). () = every task alike.
    size_tokens: tuple[int, ...] = ()
    task_s: tuple[float, ...] = ()
    ttt_s: tuple[float, ...] = ()
    answer_room: int = 931  # tokens kept free after the prompt for the answer (30 x 31 + <eos>)

    def __post_init__(self) -> None:
        if not self.devices or not self.max_len:
            raise ValueError("run.devices and run.max_len need at least one entry")
        if self.min_task_s > self.max_task_s:
            raise ValueError("run.min_task_s must not exceed run.max_task_s")
        if self.respawns < 0:
            raise ValueError(f"run.respawns must be at least 0, got {self.respawns}")
        if len(self.task_s) != len(self.size_tokens) or self.ttt_s and len(self.ttt_s) != len(self.task_s):
            raise ValueError(f"run.task_s ({len(self.task_s)} values) and run.ttt_s ({len(self.ttt_s)}, or none) need "
                             f"one value per run.size_tokens ({len(self.size_tokens)})")
        if list(self.size_tokens) != sorted(set(self.size_tokens)):
            raise ValueError(f"run.size_tokens must increase, got {list(self.size_tokens)}")
        if any(t <= 0 for t in self.task_s) or any(not 0 <= a <= t for a, t in zip(self.ttt_s, self.task_s)):
            raise ValueError(f"run.task_s must be positive and each run.ttt_s within it, got {list(self.task_s)} "
                             f"and {list(self.ttt_s)}")

    def context(self, worker: int) -> int:
        return self.max_len[min(worker, len(self.max_len) - 1)]

    def task_need(self, cost: int) -> float:
        """A task's seconds by its size (`task_s`); 1.0 for every task without a table (the queue's unit)."""
        return _interp(cost, self.size_tokens, self.task_s) if self.task_s else 1.0

    def ttt_share(self, cost: int, default: float) -> float:
        """The share of a task's limit its training takes: `ttt_s / task_s` at its size, else `default`."""
        if not self.ttt_s:
            return default
        return _interp(cost, self.size_tokens, self.ttt_s) / self.task_need(cost)

    def scaled(self, time_limit_s: float) -> RunConfig:
        """This run in miniature for a shorter time limit (the commit run's rehearsal, submission.main
        --scale-schedule): the margins and the bounds on a task's limit multiplied by time_limit_s / self.time_limit_s,
        so a rehearsal of a few tasks in 30 minutes starts them all as the full run would (unscaled, grid-4b-4xL4's
        15-minute stop-new margin and 20-minute minimum task would leave one task). As ScheduleConfig.scaled."""
        f = time_limit_s / self.time_limit_s
        return replace(self, time_limit_s=time_limit_s, hard_stop_margin_s=self.hard_stop_margin_s * f,
                       stop_new_margin_s=self.stop_new_margin_s * f, min_task_s=self.min_task_s * f,
                       max_task_s=self.max_task_s * f)

    @property
    def hard_stop(self) -> float:
        return self.time_limit_s - self.hard_stop_margin_s

    @property
    def stop_new(self) -> float:
        return self.time_limit_s - self.stop_new_margin_s


@dataclass(frozen=True)
class GridBuildConfig:
    """How `make bundle` / build.pipeline lays out this profile's Kaggle dataset: the checkpoint goes in as it is
    (build.models.grid_vocab's cut, fine-tuned or not); no pruning or quantisation on this line."""

    target: str = "cpu-py311"  # offline_wheels/targets.toml


@dataclass(frozen=True)
class GridProfile:
    name: str = "grid"
    line: str = "grid"
    model: ModelConfig = field(default_factory=ModelConfig)
    ttt: TTTConfig = field(default_factory=TTTConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    rescore: RescoreConfig = field(default_factory=RescoreConfig)
    run: RunConfig = field(default_factory=RunConfig)
    build: GridBuildConfig = field(default_factory=GridBuildConfig)
