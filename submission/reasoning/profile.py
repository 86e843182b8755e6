"""The reasoning line's run profile: one TOML file per profile, the whole truth of a run (STYLE 3).

    [engine]   kind, model, parallelism, KV cache, sampling and phase settings  (EngineConfig)
    [prompt]   rendering of tasks into the chat template                        (PromptConfig)
    [schedule] every number of SPEC section 5                                   (submission.schedule.ScheduleConfig)
    [sandbox]  program-check limits                                 (submission.sandbox.client.SandboxLimits)
    [tool_agent] first attempts that check their programs between turns         (tool_agent.ToolAgentConfig)
    [selection] which candidates an answer is chosen from                       (submission.selection.SelectionConfig)
    [build]    how make bundle builds this profile's dataset                    (BuildConfig)

Every field is documented where it is defined; submission.profiles reads and writes the files (unknown sections and
keys refused with the file, section and key) and holds the other lines' profiles' loader too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from submission.sandbox.client import SandboxLimits
from submission.schedule import ScheduleConfig
from submission.selection import SelectionConfig
from submission.reasoning.tool_agent import ToolAgentConfig

FORCED_CLOSE = "Considering the limited time by the user, I have to give the solution based on the thinking directly now."


@dataclass(frozen=True)
class EngineConfig:
    kind: str = "hf"  # "hf" (transformers), "vllm" (in-process AsyncLLM) or "replay" (logged attempts)
    model: str = ""  # checkpoint folder; --model overrides it
    dtype: str = "bfloat16"
    temperature: float = 0.6  # thinking (SPEC section 2)
    top_p: float = 0.95
    top_k: int = 20
    answer_temperature: float = 0.3  # grid and program tokens
    answer_max_tokens: int = 4000  # grid + cue + program + end of turn, on top of the thinking cap
    program_max_chars: int = 6000  # the grammar closes the code block after this many characters of body
    forced_close: str = FORCED_CLOSE  # said at the thinking cap before </think>
    # The study's words (seed ~2341-2343: the cue "asks for “The transformation above, written as a self-contained
    # Python function” and opens a code block with def transform(grid):"); the colon and line breaks are the kit's.
    program_cue: str = ("\n\nThe transformation above, written as a self-contained Python function:\n```python\n"
                        "def transform(grid):")
    max_num_seqs: int = 8  # requests decoded together (vLLM) / batch size (hf)
    max_model_len: int = 0  # 0: the model's own maximum (vLLM's default)
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    enable_expert_parallel: bool = False
    kv_cache_dtype: str = "auto"  # "fp8" uses the checkpoint's k_scale / v_scale
    kv_cache_memory_bytes: int = 0  # per GPU; 0: the engine's default share of memory
    mtp_speculative_tokens: int = 0  # multi-token prediction draft length; 0 = off
    enforce_eager: bool = False  # vLLM: no torch.compile / CUDA graphs (the CPU build compiles for minutes)
    draft_sample_method: str = "greedy"  # vLLM's speculative draft_sample_method: "greedy" or "probabilistic"
    # The dense 44.03 run's two decode speed-ups (study ~2296-2298). vLLM 0.33's parallel_config.
    # enable_batch_sharded_sampling: each tensor-parallel rank samples a slice of the batch; vLLM drops it with a
    # warning for a model without compute_logits_local (v1/worker/gpu/model_runner.py ~444-462: Qwen3.5 has it,
    # qwen3_5.py ~432, Qwen3-Next not) and refuses it under tensor parallelism 1 or max_num_seqs below it
    # (config/vllm.py ~3182-3220).
    batch_sharded_sampling: bool = False
    # speculative_config.use_local_argmax_reduction: greedy MTP drafts by a vocab-parallel local argmax instead of
    # gathering the full logits; the draft head must have get_top_tokens (LocalArgmaxMixin: Qwen3_5MTP,
    # qwen3_5_mtp.py ~216) and vLLM refuses it with probabilistic drafts (v1/worker/gpu/spec_decode/speculator.py
    # ~415-421).
    local_argmax_reduction: bool = False
    pp_layer_partition: str = ""  # layers per pipeline stage, e.g. "25,23" (vLLM's VLLM_PP_LAYER_PARTITION); "" = even
    disable_custom_all_reduce: bool = False  # vLLM's flag: NCCL's all-reduce instead of vLLM's custom kernel
    prefix_caching: str = "auto"  # "auto" = vLLM's default for the model, "on", "off"
    indexer_kv_dtype: str = "auto"  # vLLM's attention_config.indexer_kv_dtype (sparse-attention indexers only)
    max_num_batched_tokens: int = 0  # tokens per engine step (chunked prefill); 0 = vLLM's default
    stats_window_s: float = 10.0  # throughput statistics window (tokens generated, running requests)
    replay_time_scale: float = 1.0  # replay engine: logged durations are multiplied by this (0 = instant)

    def __post_init__(self) -> None:
        if self.kind not in ("hf", "vllm", "replay"):
            raise ValueError(f"engine.kind must be hf, vllm or replay, not {self.kind!r}")
        # a 30x30 grid takes ~1,830 tokens (digits, spaces, newlines) and comes first: it always completes. The
        # program then ends at its fence (at most program_max_chars) or, for very long non-ASCII text, at this limit.
        if self.answer_max_tokens < 1900:
            raise ValueError("engine.answer_max_tokens must leave room for a 30x30 grid (1,900 tokens)")
        if self.prefix_caching not in ("auto", "on", "off"):
            raise ValueError(f"engine.prefix_caching must be auto, on or off, not {self.prefix_caching!r}")
        if self.draft_sample_method not in ("greedy", "probabilistic"):
            raise ValueError(f"engine.draft_sample_method must be greedy or probabilistic, not "
                             f"{self.draft_sample_method!r}")
        if self.local_argmax_reduction and (not self.mtp_speculative_tokens or self.draft_sample_method != "greedy"):
            raise ValueError("engine.local_argmax_reduction applies to greedy MTP drafts only: it needs "
                             "mtp_speculative_tokens > 0 and draft_sample_method = \"greedy\" (vLLM refuses it with "
                             "probabilistic drafts)")
        if self.batch_sharded_sampling and not 1 < self.tensor_parallel_size <= self.max_num_seqs:
            raise ValueError("engine.batch_sharded_sampling shards the batch over tensor-parallel ranks: it needs "
                             "tensor_parallel_size > 1 and max_num_seqs at least tensor_parallel_size")


GRID_FORMATS = ("rows", "json")  # PromptConfig.grid_format


@dataclass(frozen=True)
class PromptConfig:
    """How a task becomes the user message; the solver and RFT's traces and rows (training.traces, training.dataset)
    read the same section of the same profile, so a model is prompted as its training rows were."""

    reasoning_effort: str = ""  # passed to chat templates that take one (e.g. "xhigh"); "" = not passed
    system: str = ""  # optional system message
    instruction: str = (
        "Find the common rule that maps each input grid to its output grid in the examples, then apply it to the "
        "test input. Answer with the output grid, one row per line, digits separated by spaces.")
    # How the prompt writes grids: "rows", its size `RxC` then one row per line, digits separated by spaces (the MoE
    # runs from 53.33 on); "json", a JSON list of rows (RFT v1's traces and the dense 44.03 run). Answers are rows.
    grid_format: str = "rows"

    def __post_init__(self) -> None:
        if self.grid_format not in GRID_FORMATS:
            raise ValueError(f"prompt.grid_format must be one of {', '.join(GRID_FORMATS)}, not {self.grid_format!r}")


@dataclass(frozen=True)
class BuildConfig:
    """How `make bundle` / build.pipeline turns a checkpoint into this profile's Kaggle dataset."""

    target: str = "cpu-py311"  # offline_wheels/targets.toml
    expert_list: str = ""  # build.prune.experts list to prune with ("" = no pruning)
    recipe: str = ""  # build/recipes/*.toml ("" = no quantisation)
    calibration_tasks: str = ""  # ARC tasks for KV-cache and static input scales ("" = none)


@dataclass(frozen=True)
class Profile:
    name: str = "default"
    engine: EngineConfig = field(default_factory=EngineConfig)
    prompt: PromptConfig = field(default_factory=PromptConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    sandbox: SandboxLimits = field(default_factory=SandboxLimits)
    tool_agent: ToolAgentConfig = field(default_factory=ToolAgentConfig)
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    build: BuildConfig = field(default_factory=BuildConfig)
