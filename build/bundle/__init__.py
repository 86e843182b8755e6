"""The offline Kaggle dataset and its notebook: the bundle's layout, manifest and verification (`bundler`;
`python -m build.bundle` runs it) and the notebook's generator (`notebook`).

Reads submission/'s Kaggle runtime (what boot expects of a bundle: submission.kaggle.bundle_files, mounts, supervise)
and offline_wheels/; may import build/'s core; must not import models/, prune/, quantize/ or the chain: a bundle
carries whatever checkpoint it is handed, however it was made (the chain, `build.pipeline`, hands it one)."""
