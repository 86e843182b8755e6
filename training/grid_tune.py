"""Continued fine-tuning of the grid model on real labelled tasks, before the run (SPEC section 10).

    python -m training.grid_tune --model GRID_DIR --tasks DIR [--tasks DIR ...] [--in-sample-tasks DIR] --out DIR
                                 [--format kit16|nvarc | --profile GRID_PROFILE]
                                 [--steps N] [--checkpoint-every N] [--session-steps N] [--max-len 8192]
                                 [--rank 256] [--alpha 32] [--lr 5e-5] [--max-tasks N] [--backend peft|unsloth]
                                 [--config FILE.toml] [--corpus DIR --corpus-fraction F --corpus-seed S]
    python -m training.grid_tune --model GRID_DIR --out DIR --merge

Every labelled task (the study: ARC-AGI-1 training + evaluation, ARC-AGI-2 training) becomes 16 sequences: 8
dihedral transforms x 2 permutations of all ten colours, demonstrations shuffled, its test pairs appended as
demonstrations, cut from the front to fit `--max-len`, the loss on every output grid and its end token, in the
checkpoint's grid format as the solver writes it (submission/grid/format.py): `--format`, else the `model.format` of
the grid profile `--profile` names, else kit16; its token ids are read from the checkpoint's tokenizer and a
checkpoint that cannot write it is refused before any work (exit status 2, the token named), as the run refuses it.
The format is recorded in out/grid_format.json beside the rows, and a resumed run in another format is refused.
`--in-sample-tasks` adds a set the same way (the study added the public ARC-AGI-2 evaluation tasks): local
evaluation on those tasks is then in-sample, and the run says so.
`--corpus` mixes the training tasks of a generated corpus in at `--corpus-fraction` of all tasks (or as the `[corpus]`
table of `--config` says), as `training.traces` does: training/corpus/mix.py. `--max-tasks` counts the real tasks of
each folder; the corpus adds its share on top. The rows are made once, into out/rows.jsonl: a resumed run keeps them.

The LoRA has the per-task shape (rank 256, alpha 32, rank-stabilised, q/k/v/o/gate/up/down, embedding and output
layers in full); AdamW lr 5e-5 without weight decay, 5% warm-up, cosine over the planned steps (`--steps`, default
one pass), batch 1, clip 1.0. The adapter and AdamW's state stay in the model's dtype (`--dtype bfloat16` on a
GPU, as NVARC trains and the run's TTT does: PEFT's default upcasts them to float32, 1.4x slower on an L4), and the
adapter it saves loads as it is in the run (`--adapter DIR`). Every `--checkpoint-every` steps the adapter,
optimiser and step are saved; a second run with the same --out resumes there (`--session-steps` ends a session early, e.g. to fit a time-limited box).
Progress on stderr, the loss curve as loss.png. `--merge` folds the adapter into the model (the grid model's rows
are never patched: its <eos> must stay live). `--backend unsloth` builds the same LoRA through unsloth (its kernels;
the fast path on a GPU) in its own environment (`make unsloth-env`: it pins older transformers and trl); the adapter
it saves is a PEFT adapter, so resuming, `--merge` and the solver are the same for both backends.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from pathlib import Path

from submission.grid.profile import ModelConfig
from submission.grid.format import KIT16, LAYOUTS, FormatError, GridFormat, encode, read_format
from submission.profiles import ProfileError, load_grid_profile
from submission.tasks import Pair, Task, load_tasks
from submission.views import View, colour_permutation
from training.corpus import mix
from training.corpus.mix import CorpusMix
from training.dataset import IGNORE, Row, read_rows, write_rows
from training.rft import loss_curve, resolve_device, schedule

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def task_rows(task: Task, max_len: int, seed: int = 0, dihedrals: int = 8, colour_perms: int = 2,
              fmt: GridFormat = KIT16) -> list[Row]:
    """The task's sequences, its test pairs appended as demonstrations (labels required). Pure."""
    if task.test_outputs is None:
        raise ValueError(f"task {task.id}: test outputs missing (continued fine-tuning needs labelled tasks)")
    labelled = Task(task.id, task.train + tuple(Pair(i, o) for i, o in zip(task.test_inputs, task.test_outputs)),
                    task.test_inputs, task.test_outputs)
    rng = random.Random(f"tune:{seed}:{task.id}")
    rows = []
    for index in range(dihedrals * colour_perms):
        order = list(range(len(labelled.train)))
        rng.shuffle(order)
        view = View(index % dihedrals, colour_permutation(rng, keep_zero=False), tuple(order))
        encoded = encode(view.apply(labelled).train, max_len=max_len, fmt=fmt)
        if encoded.shown:
            labels = [t if m else IGNORE for t, m in zip(encoded.ids, encoded.output_mask)]
            rows.append(Row(task.id, index, list(encoded.ids), labels))
    return rows


def build_rows(folders: list[Path], in_sample: list[Path], max_len: int, max_tasks: int | None,
               corpus: CorpusMix = CorpusMix(), fmt: GridFormat = KIT16) -> list[Row]:
    """Rows of the folders' first `max_tasks` tasks each, the corpus mixed in at its fraction of all of them."""
    tasks = []
    for folder in folders + in_sample:
        tasks += load_tasks(folder).tasks[:max_tasks]
        if folder in in_sample:
            print(f"warning: {folder} is trained on with its test pairs: evaluating on it afterwards is in-sample",
                  file=sys.stderr)
    return [row for task in mix.apply(tasks, corpus) for row in task_rows(task, max_len, fmt=fmt)]


def grid_format(args: argparse.Namespace) -> GridFormat:
    """The format to train in (`--format`, else `--profile`'s model.format, else kit16) with the checkpoint's ids;
    FormatError (or ProfileError) before anything is written or loaded."""
    name = args.format or (load_grid_profile(args.profile).model.format if args.profile else ModelConfig().format)
    return read_format(args.model, name)


def check_rows_format(out: Path, fmt: GridFormat) -> None:
    """Rows made in one format are not trained on in another: a resumed run keeps its rows, so one in another format
    than out/grid_format.json records (kit16 for rows made before the record existed) is refused naming the file."""
    record = out / "grid_format.json"
    if not (out / "rows.jsonl").exists():
        return
    made = json.loads(record.read_text()).get("format") if record.exists() else KIT16.name
    if made != fmt.name:
        raise FormatError(f"{record}: field 'format' is {made!r}, this run's is {fmt.name!r}: its rows and "
                          f"checkpoint are in the other format (another --out starts afresh)")


def _unsloth_model(args: argparse.Namespace, device: str):
    """The base model through unsloth, refused unless it has the grid vocabulary (as load_model refuses)."""
    import torch
    from unsloth import FastLanguageModel

    from submission.grid.format import VOCAB

    model, _ = FastLanguageModel.from_pretrained(model_name=str(args.model), max_seq_length=args.max_len,
                                                 dtype=getattr(torch, args.dtype), load_in_4bit=False,
                                                 use_gradient_checkpointing=False, device_map=device)
    if model.config.vocab_size != VOCAB:
        raise ValueError(f"{args.model}/config.json: vocab_size is {model.config.vocab_size}, the grid line needs "
                         f"{VOCAB} (cut the checkpoint with python -m build.models.grid_vocab)")
    return model


def train(args: argparse.Namespace, fmt: GridFormat = KIT16) -> list[float]:
    corpus = mix.resolve(args)  # a bad [corpus] table or option fails before torch loads
    if args.backend == "unsloth":
        import unsloth  # noqa: F401 - unsloth patches transformers and must come first
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model

    from submission.grid.model import load_model

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    rows_path = out / "rows.jsonl"
    if not rows_path.exists():
        write_rows(build_rows(args.tasks, args.in_sample_tasks, args.max_len, args.max_tasks, corpus, fmt), rows_path)
        (out / "grid_format.json").write_text(json.dumps({"format": fmt.name}) + "\n")
    rows = read_rows(rows_path)
    if not rows:
        raise ValueError(f"{rows_path}: no rows")
    torch.manual_seed(0)
    device = resolve_device(args.device)
    model = _unsloth_model(args, device) if args.backend == "unsloth" else load_model(args.model, args.dtype, device)
    checkpoint = out / "checkpoint"
    if (checkpoint / "state.pt").exists():
        model = PeftModel.from_pretrained(model, checkpoint, is_trainable=True, autocast_adapter_dtype=False)
    elif args.backend == "unsloth":
        from unsloth import FastLanguageModel

        model = FastLanguageModel.get_peft_model(model, r=args.rank, lora_alpha=args.alpha, lora_dropout=0.0,
                                                 target_modules=list(TARGETS), use_rslora=True,
                                                 modules_to_save=["embed_tokens", "lm_head"],
                                                 use_gradient_checkpointing=False, random_state=0)
    else:
        model = get_peft_model(model, LoraConfig(r=args.rank, lora_alpha=args.alpha, use_rslora=True,
                                                 lora_dropout=0.0, target_modules=list(TARGETS),
                                                 modules_to_save=["embed_tokens", "lm_head"], task_type="CAUSAL_LM"),
                              autocast_adapter_dtype=False)
    params = [p for p in model.parameters() if p.requires_grad]
    optimiser = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    total = args.steps or len(rows)
    order = random.Random(0).sample(range(len(rows)), len(rows))
    step, losses = 0, []
    if (checkpoint / "state.pt").exists():
        state = torch.load(checkpoint / "state.pt", weights_only=False, map_location=device)
        optimiser.load_state_dict(state["optimizer"])
        step, losses = state["step"], state["losses"]
        print(f"resuming at step {step} of {total}", file=sys.stderr)
    end = min(total, step + args.session_steps) if args.session_steps else total
    model.train()
    for step in range(step, end):
        for group in optimiser.param_groups:
            group["lr"] = args.lr * schedule(step, total, 0.05)
        row = rows[order[step % len(rows)]]
        loss = model(input_ids=torch.tensor([row.input_ids], device=device),
                     labels=torch.tensor([row.labels], device=device)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimiser.step()
        optimiser.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        print(f"step {step + 1}/{total} loss {losses[-1]:.4f}", file=sys.stderr)
        if (step + 1) % args.checkpoint_every == 0 or step + 1 == end:
            model.save_pretrained(checkpoint)
            torch.save({"optimizer": optimiser.state_dict(), "step": step + 1, "losses": losses},
                       checkpoint / "state.pt")
    if end == total:
        model.save_pretrained(out / "adapter")
    loss_curve(losses, out / "loss.png")
    (out / "losses.json").write_text(json.dumps(losses))
    return losses


def merge(model_dir: Path, out: Path) -> Path:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    dtype = base.config.dtype if isinstance(base.config.dtype, torch.dtype) else torch.bfloat16
    merged = PeftModel.from_pretrained(base, out / "adapter").merge_and_unload()
    target = out / "merged"
    shutil.rmtree(target, ignore_errors=True)
    merged.to(dtype).save_pretrained(target)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                 "vocab.json", "chat_template.j2", "grid_vocab.json"):  # the kit's cut's files and NVARC's
        if (model_dir / name).exists():
            shutil.copy(model_dir / name, target / name)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.grid_tune", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, type=Path, help="grid checkpoint (build.models.grid_vocab's output)")
    parser.add_argument("--tasks", action="append", type=Path, default=[], help="labelled task folder (repeatable)")
    parser.add_argument("--in-sample-tasks", action="append", type=Path, default=[],
                        help="a labelled set whose later evaluation becomes in-sample (e.g. ARC-AGI-2 evaluation)")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--format", choices=sorted(LAYOUTS),
                        help="the checkpoint's grid format (default: --profile's model.format, else kit16)")
    parser.add_argument("--profile", help="grid profile (name or TOML path) whose model.format is the default")
    parser.add_argument("--steps", type=int, default=0, help="planned steps (0: one pass over the rows)")
    parser.add_argument("--checkpoint-every", type=int, default=2000)
    parser.add_argument("--session-steps", type=int, default=0, help="stop this session after N steps (resumable)")
    parser.add_argument("--max-len", type=int, default=8192)
    parser.add_argument("--max-tasks", type=int, help="first N tasks of each folder (demos)")
    parser.add_argument("--rank", type=int, default=256)
    parser.add_argument("--alpha", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--dtype", default="float32", help="bfloat16 on a GPU")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--merge", action="store_true", help="merge out/adapter into the model: out/merged")
    parser.add_argument("--backend", choices=("peft", "unsloth"), default="peft",
                        help="unsloth: its own environment (make unsloth-env)")
    mix.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.merge:
        print(merge(args.model, args.out))
        return 0
    if not args.tasks and not args.in_sample_tasks:
        parser.error("--tasks: at least one labelled task folder")
    try:  # the checkpoint must write the format: refused here, before any row is made or weight loaded
        fmt = grid_format(args)
        check_rows_format(args.out, fmt)
    except (FormatError, ProfileError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    losses = train(args, fmt)
    print(f"{len(losses)} steps; loss {losses[0]:.4f} -> {losses[-1]:.4f}; {args.out / 'loss.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
