"""The kit dataset's files as Kaggle mounts them: a folder or an archive per top-level folder, checked against the
manifest, split files joined, writing to local disk only what must be written. Standard library only (boot runs it
before any wheel is installed).

Why archives: the Kaggle client uploads only a dataset's top-level files unless `--dir-mode zip|tar`, which uploads
each top-level folder as one archive (kaggle's `DirectoryArchive`: member paths relative to the folder). Kaggle's
backend usually unpacks them into folders (Kaggle/kaggle-cli pull request 111), but not always (issue 292 there:
the same command left .tar files on one machine and folders on another). So each top-level name of the manifest is
taken as it is mounted: a folder is used in place; `NAME.zip` or `NAME.tar` is extracted to local disk with a line
of progress, every file hashed as it is written and checked against the manifest. Only when something had to be
extracted or joined does boot build a view of the bundle (`materialise`), in which mounted folders are symbolic
links: the disk it uses is the extracted archives and the joined files, never a copy of what is mounted.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tarfile
import time
import zipfile
from pathlib import Path, PurePosixPath
from typing import Callable, TextIO

MODEL_DIRS = ("model", "grid-model")  # the bundle's checkpoints: the line's own; a combined bundle's grid model
ARCHIVES = (".tar", ".zip")  # what the kaggle client's --dir-mode writes for a folder
MANIFEST = "manifest.json"
CHUNK = 8 << 20


class BundleError(RuntimeError):
    pass


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def manifest_problems(bundle: Path, full: bool = True) -> list[str]:
    """Files of the manifest that are missing or differ in size or sha256 (model files by size only unless `full`:
    hashing tens of GB at every boot costs minutes). build.bundle's verify uses it too."""
    manifest = json.loads((bundle / MANIFEST).read_text())
    problems = []
    for name, entry in manifest["files"].items():
        path = bundle / name
        if not path.exists():
            problems.append(f"missing: {name}")
        elif path.stat().st_size != entry["bytes"]:
            problems.append(f"size differs: {name}")
        elif (full or name.split("/")[0] not in MODEL_DIRS) and sha256(path) != entry["sha256"]:
            problems.append(f"sha256 differs: {name}")
    return problems


def top_levels(manifest: dict) -> list[str]:
    """The manifest's top-level names (folders such as wheels/, model/, kit/, and top-level files)."""
    return sorted({name.split("/")[0] for name in manifest["files"]})


def mounted(mount: Path, top: str) -> Path | None:
    """Where `top` is under `mount`: itself (a folder Kaggle unpacked, or a file), else its archive, else None."""
    for candidate in (mount / top, *(mount / f"{top}{suffix}" for suffix in ARCHIVES)):
        if candidate.exists():
            return candidate
    return None


def split_parts(manifest: dict) -> dict[str, list[str]]:
    """Files split at bundle time (`NAME<suffix>000`, `001`, ...) by the name they are joined to. Pure."""
    suffix = manifest.get("split_part_suffix", ".part")
    out: dict[str, list[str]] = {}
    for name in sorted(manifest["files"]):
        stem, _, number = name.rpartition(suffix)
        if stem and len(number) == 3 and number.isdigit():
            out.setdefault(stem, []).append(name)
    return out


def disk_needed(manifest: dict, archived: set[str]) -> int:
    """Bytes `materialise` writes: every file of the archived top-level folders, plus each joined file (its parts'
    bytes). Pure. A joined file inside an extracted folder is counted twice, as its parts are removed only once it is
    whole."""
    files = manifest["files"]
    extracted = sum(entry["bytes"] for name, entry in files.items() if name.split("/")[0] in archived)
    joined = sum(files[part]["bytes"] for parts in split_parts(manifest).values() for part in parts)
    return extracted + joined


def _member_path(name: str, archive: Path) -> PurePosixPath:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts:
        raise BundleError(f"{archive}: member {name!r} would land outside its folder")
    return path


def _copy_hashed(source, target: Path, progress: Callable[[int], None]) -> str:
    digest = hashlib.sha256()
    with open(target, "wb") as out:
        while piece := source.read(CHUNK):
            digest.update(piece)
            out.write(piece)
            progress(len(piece))
    return digest.hexdigest()


def _members(archive: Path):
    """(name, open function, is a folder) for each member of a zip or an uncompressed tar; links are refused."""
    if archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as z:
            for info in z.infolist():
                yield info.filename, (lambda info=info: z.open(info)), info.is_dir()
        return
    with tarfile.open(archive) as t:
        for member in t:
            if not (member.isfile() or member.isdir()):
                raise BundleError(f"{archive}: member {member.name!r} is a link or device; the bundle has none")
            yield member.name, (lambda member=member: t.extractfile(member)), member.isdir()


def extract(archive: Path, target: Path, expected: dict[str, dict], log: TextIO = sys.stdout) -> list[str]:
    """Extract `archive` into `target`, hashing every file as it is written; `expected` maps member paths (relative
    to the folder, as the kaggle client writes them) to their manifest entries. Returns the problems: files
    missing from the archive, or differing in size or sha256. One progress line at most every 10 s."""
    total = sum(entry["bytes"] for entry in expected.values())
    done, last, start = 0, time.monotonic(), time.monotonic()

    def progress(n: int) -> None:
        nonlocal done, last
        done += n
        if time.monotonic() - last >= 10:
            last = time.monotonic()
            print(f"boot: extracting {archive.name}: {done / 2**30:.1f} of {total / 2**30:.1f} GiB", file=log,
                  flush=True)

    print(f"boot: extracting {archive} ({total / 2**30:.2f} GiB) into {target}", file=log, flush=True)
    seen, problems = set(), []
    target.mkdir(parents=True, exist_ok=True)
    for name, opener, is_dir in _members(archive):
        relative = _member_path(name, archive)
        if is_dir or not relative.parts:
            (target / relative).mkdir(parents=True, exist_ok=True)
            continue
        key = str(relative)
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        with opener() as source:
            digest = _copy_hashed(source, target / relative, progress)
        seen.add(key)
        entry = expected.get(key)
        if entry is None:
            problems.append(f"not in the manifest: {archive.name}:{key}")
        elif (target / relative).stat().st_size != entry["bytes"] or digest != entry["sha256"]:
            problems.append(f"{'size' if (target / relative).stat().st_size != entry['bytes'] else 'sha256'} "
                            f"differs: {archive.name}:{key}")
    problems += [f"missing: {archive.name}:{key}" for key in sorted(set(expected) - seen)]
    print(f"boot: extracted {archive.name}: {done / 2**30:.2f} GiB in {time.monotonic() - start:.0f} s", file=log,
          flush=True)
    return problems


def materialise(mount: Path, work: Path, log: TextIO = sys.stdout) -> tuple[Path, list[str]]:
    """The bundle as a folder in which every manifest path exists: `mount` itself when every top-level name is
    mounted as a folder or file, else a view under `work` (mounted folders linked, archives extracted and checked).
    Returns the folder and the extraction's problems (empty when every extracted file matched)."""
    manifest = json.loads((mount / MANIFEST).read_text())
    where = {top: mounted(mount, top) for top in top_levels(manifest)}
    archived = {top for top, path in where.items() if path is not None and path.name != top}
    if not archived:
        return mount, []
    view = work / "bundle"
    shutil.rmtree(view, ignore_errors=True)
    view.mkdir(parents=True)
    os.symlink(mount / MANIFEST, view / MANIFEST)
    problems = []
    for top, path in where.items():
        if path is None:
            continue  # manifest_problems names each missing file
        if top in archived:
            expected = {name[len(top) + 1:]: entry for name, entry in manifest["files"].items()
                        if name.startswith(top + "/")}
            problems += extract(path, view / top, expected, log)
        else:
            os.symlink(path, view / top)
    return view, problems


def join_split_files(bundle: Path, work: Path) -> Path:
    """`bundle` itself when nothing is split, else a view under `work` where each split file is joined and every
    other file is a link to the bundle's (a folder of links holding the joined file; the parts stay out of it).
    What it writes is the joined files, nothing else."""
    manifest = json.loads((bundle / MANIFEST).read_text())
    parts = split_parts(manifest)
    if not parts:
        return bundle
    split_tops = {name.split("/")[0] for name in parts}
    view = work / "joined"
    shutil.rmtree(view, ignore_errors=True)
    view.mkdir(parents=True)
    os.symlink((bundle / MANIFEST).resolve(), view / MANIFEST)
    part_names = {p for names in parts.values() for p in names}
    for top in top_levels(manifest):
        if top not in split_tops:
            os.symlink((bundle / top).resolve(), view / top)
    for name in sorted(manifest["files"]):
        if name.split("/")[0] in split_tops and name not in part_names:
            (view / name).parent.mkdir(parents=True, exist_ok=True)
            os.symlink((bundle / name).resolve(), view / name)
    for joined, names in parts.items():
        (view / joined).parent.mkdir(parents=True, exist_ok=True)
        with open(view / joined, "wb") as out:
            for name in names:
                with open(bundle / name, "rb") as part:
                    shutil.copyfileobj(part, out, CHUNK)
    return view
