"""Admission by behaviour (SPEC 11): a rule enters the corpus only if it does something new on the fixed probe bank.

A behaviour vector holds one code per probe slot: a 63-bit BLAKE2b digest of the output (shape and cells), or a
small negative code naming the oracle's error type. The eight dihedral conjugates x -> g^-1(p(g x)) act on the body
only (the palette key row stays on top), since the key is metadata, not picture. A candidate is admitted when
  - at least 16 slots of its raw vector are valid (not an error),
  - its distance to every admitted vector is >= 3, raw and under every conjugate (g = identity is the raw form),
where the distance is the number of differing slots. Before that, `admit_program` refuses a program with a stage
that does nothing on the bank (dropping a post operation, making the mask operator `keep` or switching the
connectivity leaves every slot as it was: bbox then flip_lr is just bbox): no task could show that stage, so the gate
would reject all of its tasks.
The search does not scan the corpus (issue 32): `BlockIndex` splits the slots into b interleaved blocks and keys
every admitted vector by a hash of each set of `agree` of its blocks. Two vectors at distance d agree exactly on at
least b - d blocks (pigeonhole), so at d <= b - agree they share a key: the rows sharing a bucket with a candidate
hold every admitted row within distance b - agree, and only those are compared slot by slot. Admission decides at
distance < 3 with 4 blocks keyed in pairs (exact: every row within distance 2 is compared). Pairs, not single blocks
as at first: one block of 3 is a third of the slots, which rules valid on few slots (all errors there) share by the
hundred, so the rows compared grew with the corpus (`Admitter.cost` on tests/test_corpus.py's corpora: 0.053 a
candidate at 2k rows, 0.67 at 16k; keyed in pairs 0.0003 and 0.015); two blocks of 4 are half of them, which such
rules rarely share. The gate's rivals (`nearest`) are the nearest rules within
`RIVAL_RADIUS` = 15, found with 16 single blocks; a bucket is read up to its first `BUCKET_CAP` rows (admission
order), so rival search stays bounded where many rules share a block and is exact while no bucket it reads is
fuller than that.
`Admitter` is the pure core (arrays in, verdicts out); `behaviours` is the shell that runs the oracle.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from training.corpus import dsl, oracle, rules
from training.corpus.dsl import Program

MIN_VALID = 16
MIN_DISTANCE = 3
RIVAL_RADIUS = 15  # `nearest` looks for rivals up to this distance; farther rules are not rivals
BUCKET_CAP = 32  # rows read per bucket by `nearest`: full buckets hold blocks that many rules share (few valid slots)
CHUNK_ROWS = 4096
REASONS = ("admitted", "redundant_stage", "too_few_valid", "duplicate_raw", "duplicate_dihedral", "near_raw",
           "near_dihedral")


def dihedral(grid: np.ndarray, g: int) -> np.ndarray:
    """The g-th of the 8 symmetries of the square (0 = identity; 4..7 mirror first, then rotate).

    >>> dihedral(np.array([[1, 2]]), 1).tolist(), dihedral(np.array([[1, 2]]), 4).tolist()
    ([[2], [1]], [[2, 1]])
    """
    return np.rot90(grid[:, ::-1] if g >= 4 else grid, g % 4)


def dihedral_inverse(grid: np.ndarray, g: int) -> np.ndarray:
    """Undo `dihedral(., g)`.

    >>> x = np.arange(6).reshape(2, 3)
    >>> all(np.array_equal(dihedral_inverse(dihedral(x, g), g), x) for g in range(8))
    True
    """
    back = np.rot90(grid, -(g % 4))
    return back[:, ::-1] if g >= 4 else back


def conjugate_input(grid: np.ndarray, g: int) -> np.ndarray:
    """Apply g to the body of a keyed input and lay the key row out again above it (a bad key stays bad)."""
    if grid.shape[0] < 2 or grid.shape[1] < 2:
        return grid
    body = dihedral(grid[1:], g)
    key = np.full((1, body.shape[1]), grid[0, 0], dtype=grid.dtype)
    key[0, :min(body.shape[1], grid.shape[1])] = grid[0, :body.shape[1]]
    return np.vstack([key, body])


def code(output: np.ndarray) -> int:
    """A non-negative 63-bit digest of an output's shape and cells."""
    data = np.asarray(output, dtype=np.int8)
    digest = hashlib.blake2b(bytes(data.shape) + data.tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def error_code(err: oracle.OracleError) -> int:
    """-1, -2, ...: one per oracle error type (oracle.ERRORS)."""
    return -1 - oracle.ERRORS.index(type(err))


_BANKS: dict[bytes, tuple[np.ndarray, ...]] = {}


def raw_behaviour(program: Program, probes: tuple[np.ndarray, ...]) -> np.ndarray:
    """The (n_probes,) raw behaviour vector alone (row 0 of `behaviours`, 8 times cheaper), read-only.

    Memoised by (program, the bank's content): the gate asks for the same one-node variants when it proposes a
    task and again when it judges it (measured: a third of a small generate run was such repeats)."""
    digest = hashlib.blake2b(b"".join(bytes(p.shape) + np.ascontiguousarray(p, dtype=np.int8).tobytes()
                                      for p in probes), digest_size=16).digest()
    _BANKS.setdefault(digest, probes)
    return _raw_cached(program, digest)


@lru_cache(maxsize=1 << 15)
def _raw_cached(program: Program, digest: bytes) -> np.ndarray:
    out = behaviours(program, _BANKS[digest], conjugates=1)[0]
    out.flags.writeable = False
    return out


def behaviours(program: Program, probes: tuple[np.ndarray, ...], conjugates: int = 8) -> np.ndarray:
    """An (8, n_probes) int64 array: row g is the behaviour of the conjugate x -> g^-1(p(g x)); row 0 is raw."""
    out = np.empty((conjugates, len(probes)), dtype=np.int64)
    for g in range(conjugates):
        for i, probe in enumerate(probes):
            try:
                out[g, i] = code(dihedral_inverse(rules.run(program, conjugate_input(probe, g)), g))
            except oracle.OracleError as err:
                out[g, i] = error_code(err)
    return out


class BlockIndex:
    """Row numbers bucketed by a 64-bit hash of each set of `agree` of `blocks` interleaved blocks of slots (slot i
    is in block i mod blocks). `near` returns every row that shares a key with a query, a superset of the rows within
    distance blocks - agree (a hash collision only adds a row, which the exact comparison then places). Memory: one
    dict entry per row and set of blocks."""

    def __init__(self, n_slots: int, blocks: int, agree: int = 1) -> None:
        self.blocks = blocks
        self.sets = np.array(list(itertools.combinations(range(blocks), agree)), dtype=np.int64)
        rng = np.random.default_rng(32)
        # odd multipliers: a one-slot change always changes its block's hash, and a set's key mixes its blocks'
        # hashes in order (x * odd != 0 mod 2^64 for x != 0)
        self._mult = rng.integers(0, 1 << 63, n_slots, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        self._mix = rng.integers(0, 1 << 63, agree, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        self._buckets: list[dict[int, list[int]]] = [{} for _ in self.sets]

    def keys(self, rows: np.ndarray) -> np.ndarray:
        """(m, number of block sets) bucket keys of an (m, n_slots) array of behaviour rows."""
        mixed = rows.astype(np.uint64) * self._mult  # wraps mod 2^64, as a hash should
        block = np.stack([mixed[:, b::self.blocks].sum(axis=1) for b in range(self.blocks)], axis=1)
        return (block[:, self.sets] * self._mix).sum(axis=2)

    def add(self, first: int, rows: np.ndarray) -> None:
        """Index rows numbered first, first + 1, ..."""
        for offset, keys in enumerate(self.keys(rows).tolist()):
            for bucket, key in zip(self._buckets, keys):
                bucket.setdefault(key, []).append(first + offset)

    def near(self, rows: np.ndarray, cap: int | None = None) -> np.ndarray:
        """Sorted row numbers that share at least one key with any of `rows` (the first `cap` of each bucket)."""
        found: set[int] = set()
        for keys in self.keys(rows).tolist():
            for bucket, key in zip(self._buckets, keys):
                found.update(bucket.get(key, ())[:cap])
        return np.array(sorted(found), dtype=np.int64)


@dataclass(frozen=True)
class Verdict:
    reason: str  # one of REASONS
    raw_distance: int  # to the nearest admitted vector, capped at MIN_DISTANCE (-1: empty corpus, too few valid)
    dihedral_distance: int
    nearest: str | None  # id of the nearest admitted rule under any conjugate, None at MIN_DISTANCE or more


@dataclass
class SearchCost:
    """Rows compared slot by slot, and the searches that compared them, since the admitter was made: a noise-free
    figure of the block indexes' cost (times move 2x with the shared machine's load; these do not), which
    benchmarks/corpus_admission.py prints and tests/test_corpus.py pins. `judge_calls` counts the judge's index
    searches only (not a candidate valid on too few slots, nor one judged against an empty corpus)."""
    judge_rows: int = 0
    judge_calls: int = 0
    nearest_rows: int = 0
    nearest_calls: int = 0


@dataclass
class Admitter:
    """The admitted behaviour vectors (one row per rule), their block indexes (admission's and the rivals'), the
    funnel of every verdict so far and the searches' cost (`cost`)."""
    n_slots: int
    ids: list[str] = field(default_factory=list)
    funnel: Counter = field(default_factory=Counter)
    cost: SearchCost = field(default_factory=SearchCost)
    _rows: np.ndarray | None = None
    _indexes: tuple[BlockIndex, BlockIndex] | None = None

    def __post_init__(self) -> None:
        self._rows = np.empty((1024, self.n_slots), dtype=np.int64)
        self._indexes = (BlockIndex(self.n_slots, MIN_DISTANCE + 1, agree=2),
                         BlockIndex(self.n_slots, RIVAL_RADIUS + 1))

    @classmethod
    def restored(cls, ids: list[str], matrix: np.ndarray, room: int = 0) -> "Admitter":
        """An admitter holding already admitted rules (to resume a run, or to measure search at a given size), with
        space for `room` more before its rows are copied to a larger array (doubling: amortised, a copy per row)."""
        if matrix.ndim != 2 or matrix.shape[0] != len(ids):
            raise ValueError(f"matrix of shape {matrix.shape} does not hold one row per id ({len(ids)})")
        adm = cls(matrix.shape[1], ids=list(ids))
        adm._rows = np.empty((len(ids) + room, matrix.shape[1]), dtype=np.int64)
        adm._rows[:len(ids)] = matrix
        for index in adm._indexes:
            index.add(0, adm.matrix)
        return adm

    @property
    def matrix(self) -> np.ndarray:
        return self._rows[:len(self.ids)]

    def distances(self, conjugates: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """(8, len(rows)) Hamming distances from each conjugate to the admitted raw vectors numbered `rows` (default:
        all of them), exact."""
        rows = np.arange(len(self.ids)) if rows is None else rows
        out = np.empty((conjugates.shape[0], len(rows)), dtype=np.int32)
        for start in range(0, len(rows), CHUNK_ROWS):
            block = self._rows[rows[start:start + CHUNK_ROWS]]
            out[:, start:start + block.shape[0]] = (block[None, :, :] != conjugates[:, None, :]).sum(axis=2)
        return out

    def judge(self, conjugates: np.ndarray) -> Verdict:
        """The verdict for a candidate's (8, n_slots) behaviours, without admitting it."""
        if conjugates.shape != (8, self.n_slots):
            raise ValueError(f"behaviours must have shape (8, {self.n_slots}), got {conjugates.shape}")
        if int((conjugates[0] >= 0).sum()) < MIN_VALID:
            return Verdict("too_few_valid", -1, -1, None)
        if not self.ids:
            return Verdict("admitted", -1, -1, None)
        near = self._indexes[0].near(conjugates)
        self.cost.judge_rows += near.size
        self.cost.judge_calls += 1
        dist = np.minimum(self.distances(conjugates, near), MIN_DISTANCE)  # farther: admitted, not placed
        if not near.size or int(dist.min()) >= MIN_DISTANCE:
            return Verdict("admitted", MIN_DISTANCE, MIN_DISTANCE, None)
        raw, best = int(dist[0].min()), int(dist.min())
        nearest = self.ids[int(near[np.unravel_index(int(np.argmin(dist)), dist.shape)[1]])]
        if raw == 0:
            reason = "duplicate_raw"
        elif best == 0:
            reason = "duplicate_dihedral"
        elif raw < MIN_DISTANCE:
            reason = "near_raw"
        elif best < MIN_DISTANCE:
            reason = "near_dihedral"
        else:
            reason = "admitted"
        return Verdict(reason, raw, best, nearest)

    def consider(self, rule: str, conjugates: np.ndarray) -> Verdict:
        """Judge a candidate, count the verdict in the funnel, and admit it if the verdict says so."""
        verdict = self.judge(conjugates)
        self.funnel[verdict.reason] += 1
        if verdict.reason == "admitted":
            if len(self.ids) == self._rows.shape[0]:
                more = np.empty((max(len(self._rows), 1024), self.n_slots), dtype=np.int64)  # restored may be empty
                self._rows = np.concatenate([self._rows, more])
            self._rows[len(self.ids)] = conjugates[0]
            for index in self._indexes:
                index.add(len(self.ids), conjugates[:1])
            self.ids.append(rule)
        return verdict

    def nearest(self, row: int, k: int = 8) -> list[str]:
        """Ids of the k admitted rules nearest (raw distance) to admitted rule number `row`, itself excluded, among
        those within RIVAL_RADIUS that share a block (exact while no bucket holds more than BUCKET_CAP rows); ties in
        admission order."""
        near = self._indexes[1].near(self.matrix[row][None, :], BUCKET_CAP)
        near = near[near != row]
        self.cost.nearest_rows += near.size
        self.cost.nearest_calls += 1
        dist = self.distances(self.matrix[row][None, :], near)[0]
        order = [int(near[i]) for i in np.argsort(dist, kind="stable") if dist[i] <= RIVAL_RADIUS]
        return [self.ids[i] for i in order[:k]]


def redundant_stages(program: Program, probes: tuple[np.ndarray, ...]) -> list[str]:
    """Stages whose neutral form, and components whose removal (a composite's `dropped()`), leave the raw
    behaviour as it is on every probe."""
    own = raw_behaviour(program, probes)
    return [stage for stage, plain in program.neutralised() + program.dropped()
            if np.array_equal(raw_behaviour(plain, probes), own)]


def admit_program(adm: Admitter, program: Program, probes: tuple[np.ndarray, ...]) -> Verdict:
    """The shell around `Admitter.consider`: refuse redundant stages, else run the 8 conjugates and judge."""
    if redundant_stages(program, probes):
        adm.funnel["redundant_stage"] += 1
        return Verdict("redundant_stage", -1, -1, None)
    return adm.consider(dsl.rule_id(program), behaviours(program, probes))
