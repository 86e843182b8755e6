"""The models build/ makes rather than transforms: tiny random-weight checkpoints of the real architectures
(`tiny`), the real models' tensors at tiny widths (`topology`), the tokenizer both carry (`tokenizer`), and the grid
line's 16-token cut of a Qwen3 checkpoint (`grid_vocab`).

May import build/'s core (`build.checkpoint`, `build.patch_eot`: a made model is patched and read like any other);
must not import prune/, quantize/, bundle/ or the chain (`build.pipeline`, `build.check_quality`): tests and
benchmarks of every room make their checkpoints here, so a model maker that needed a room would tie them together."""
