"""Where a corpus run's measurements execute: Ray tasks (issue 32 section 1), or this process.

`RayPool(workers, address)` runs each item as a Ray task: on a local Ray that it starts with `workers` CPUs and stops
at `close` (the default), on the cluster at `address` (started with `ray start --head`; every node needs this
repository at the same path, which goes to the workers' PYTHONPATH), or on the Ray this process already holds (a test
session's). Ray places the tasks; `map` only keeps at most four tasks per CPU in flight and yields the results in
the order of the items, so the caller judges them in a fixed order and the corpus does not depend on the number of
workers. `Serial` maps in this process: `--workers 0`, and environments without Ray.
"""

from __future__ import annotations

import os
from collections import deque
from pathlib import Path
from typing import Callable, Iterable, Iterator

from training.corpus.store import CorpusError

ROOT = Path(__file__).resolve().parents[2]
IN_FLIGHT = 4  # tasks per CPU: results are taken in order, so a slow task must not leave the other CPUs idle
OBJECT_STORE_BYTES = 200 * 1024 * 1024  # results are small; Ray's default (30% of memory) is not, on a shared VM


class Serial:
    """Each item in this process, in order."""

    def map(self, fn: Callable, items: Iterable) -> Iterator:
        return map(fn, items)

    def close(self) -> None:
        pass


class RayPool:
    """Each item as a Ray task, results in the order of the items."""

    def __init__(self, workers: int | None = None, address: str | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise CorpusError("ray is not installed in this environment: use the build environment "
                              "(requirements/build-cpu.txt) or --workers 0 (this process only)") from None
        self._ray = ray
        self._owned = not ray.is_initialized()
        if self._owned:
            env = {"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                                              os.environ.get("PYTHONPATH")]))}}
            if address:
                ray.init(address=address, runtime_env=env, log_to_driver=False)
            else:
                ray.init(num_cpus=workers, include_dashboard=False, runtime_env=env, log_to_driver=False,
                         object_store_memory=OBJECT_STORE_BYTES)
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.window = IN_FLIGHT * (workers or cpus)
        self._remote: dict[Callable, object] = {}

    def map(self, fn: Callable, items: Iterable) -> Iterator:
        remote = self._remote.setdefault(fn, self._ray.remote(num_cpus=1)(fn))
        pending: deque = deque()
        for item in items:
            pending.append(remote.remote(item))
            if len(pending) >= self.window:
                yield self._ray.get(pending.popleft())
        while pending:
            yield self._ray.get(pending.popleft())

    def close(self) -> None:
        if self._owned:
            self._ray.shutdown()


def pool(workers: int, address: str | None = None) -> Serial | RayPool:
    """The command line's choice: `--workers 0` (and no address) runs in this process, anything else on Ray."""
    return Serial() if workers == 0 and not address else RayPool(workers or None, address)
