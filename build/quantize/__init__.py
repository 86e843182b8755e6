"""Quantisation by a recipe (build/recipes/): the streamed quantiser (`quantizer`; `python -m build.quantize` runs
it), the NVFP4 arithmetic (`nvfp4`), which weights vLLM fuses (`fused`), the one layer-by-layer calibration pass
(`activations`) with its static input scales (`input_scales`) and FP8 KV-cache scales (`kv_scales`), and
compressed-tensors' log level (`library_logs`).

May import build/'s core (`build.checkpoint`, `build.schemes`: the formats it writes are the ones every reader
dequantises; `build.layerwise`: the calibration pass); must not import models/, prune/, bundle/ or the chain: the
pruner and the likelihood check read this room's recipes and reports, never the other way round."""
