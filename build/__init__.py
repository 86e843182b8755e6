"""Checkpoint surgery and the offline bundle, in rooms by what they serve (build/README.md has the table):

- the core, at this folder's top: a checkpoint's files, index and shard headers read without torch (`checkpoint`),
  the quantisation schemes' formats and dequantisation every reader shares (`schemes`), a checkpoint run one decoder
  layer at a time (`layerwise`), the end-of-turn patch (`patch_eot`). It imports no room below.
- models/ (tiny checkpoints, topologies, tokenizer, the grid line's 16-token cut), quantize/ (the quantiser and its
  calibration), prune/ (routing statistics, expert lists, the pruner; it reads quantize/'s formats), bundle/ (the
  Kaggle dataset and notebook): each imports the core, none imports another but prune/ quantize/.
- the chain, at this folder's top too: `pipeline` (prune, patch, quantise, bundle; its `chain` is also RFT's merge)
  and `check_quality` (the likelihood check of what it made); they may import every room.
- `tiny`, `calibrate`, `experts`, `adoption`, `grid_vocab`, `notebook` here are thin aliases of the moved commands
  for one release (issue 46).

Run from the repo root: this regular package shadows the PyPI package `build` there; never install it."""
