"""Expert pruning of a mixture of experts (SPEC section 7): routing statistics on calibration traces (`calibrate`),
their container and bins (`stats`), expert lists from them (`experts`), the rule that adopts a smaller list
(`adoption`), and the streamed removal itself (`pruner`; `python -m build.prune` runs it).

May import build/'s core and quantize/ (the pruner takes compressed-tensors checkpoints too: it rewrites their
quantization config and the quantiser's per-module report, `build.quantize.quantizer.report_json`); must not import
models/, bundle/ or the chain (`build.pipeline`, `build.check_quality`), which call it."""
