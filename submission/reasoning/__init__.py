"""The reasoning line: a thinking model's attempts on each task under the schedule (SPEC sections 2-7).

profile (the line's profile types), prompt (the chat prompt, shared with training), reply_grammar (what the model may
write after `</think>`: a grid, a program or a tool call, and its parser), tool_agent (the check_transform turns),
solve (one attempt: prompt, engine, reply, sandbox), run (the line's run for submission.main: schedule, engine, answer
file, log, watchdog), engines/ (the engines it drives: hf, vllm with its logits processors and scheduler, replay).

May import: submission's core, submission/sandbox/ (the programs' checks). Must not import: the grid line,
submission/kaggle/, submission.main or submission.lines; build/, training/, sim/. Only `run` stands on the profiles
(submission.profiles): it is the line's run, a room above the rest of this folder (tests/test_imports.py).
"""
