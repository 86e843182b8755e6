"""The real `kaggle` client (requirements/build-cpu.txt pins kaggle 2.2.5) run on a folder, intercepted only at the
network call, and the layout Kaggle mounts the uploaded dataset as.

    sent = upload(bundle_dir, work, "tar")                         # kaggle datasets create -p DIR --dir-mode tar
    sent = upload(bundle_dir, work, "tar", version_notes="fix")    # kaggle datasets version -p DIR -m fix ...
    sent = run_client(["kaggle", "datasets", ...], work)           # any argv, e.g. the one build.bundle prints
    root = mount(sent.folder, tmp / "input", "arc-kit-bundle", unpack=True)   # /kaggle/input/arc-kit-bundle
    bundle_dir = tiny_bundle(tmp)                                  # build.bundle's CPU bundle, as tests build it

The client runs as the user runs it: the environment's `kaggle` console script in a subprocess, its working
directory outside the repository (the repository's `kaggle/` folder, the notebook's, must never shadow the package),
a private HOME and TMPDIR (no real credentials, no upload state left from another run) and fake credentials in
KAGGLE_USERNAME / KAGGLE_KEY. kaggle_transport/sitecustomize.py replaces requests' HTTPAdapter.send in that process
and answers as Kaggle's API would; nothing else of the client is changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

TRANSPORT = Path(__file__).resolve().parent / "kaggle_transport"
ARCHIVES = (".tar", ".zip")  # what the client's --dir-mode tar / zip make of each top-level folder
CREATE_ENDPOINTS = {"datasets.DatasetApiService/CreateDataset": "CreateDataset",
                    "datasets.DatasetApiService/CreateDatasetVersion": "CreateDatasetVersion"}


class ClientError(AssertionError):
    """The client failed, or sent something Kaggle's API would not have been asked for."""


@dataclass(frozen=True)
class Blob:
    """One uploaded file as the blob PUT carried it (an archive for a folder under --dir-mode zip or tar)."""
    name: str
    bytes: int
    sha256: str
    token: str


@dataclass(frozen=True)
class Upload:
    """What the client sent: the blobs (saved by name in `folder`), the final create request and every request."""
    argv: tuple[str, ...]
    blobs: tuple[Blob, ...]
    endpoint: str  # "CreateDataset" or "CreateDatasetVersion"
    create: dict  # that request's JSON as sent
    requests: tuple[dict, ...]
    client: dict  # where `kaggle` was imported from, its version, its DEFAULT_IGNORE_PATTERNS
    folder: Path
    stdout: str

    @property
    def names(self) -> list[str]:
        return sorted(blob.name for blob in self.blobs)

    @property
    def file_tokens(self) -> list[str]:
        """The tokens of the create request's files (a new version's are in its body)."""
        request = self.create.get("body", {}) if self.endpoint == "CreateDatasetVersion" else self.create
        return [entry.get("token") for entry in request.get("files", [])]


def kaggle_cli(python: Path | str = sys.executable) -> Path | None:
    """The `kaggle` console script of `python`'s environment, None where the client is not installed."""
    script = Path(python).parent / "kaggle"
    return script if script.exists() else None


def client_env(work: Path, owner: str) -> dict[str, str]:
    """The client's environment: no KAGGLE_* or PYTHON* variable of the caller's, a private HOME and TMPDIR."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAGGLE_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(HOME=str(work / "home"), XDG_CONFIG_HOME=str(work / "home" / ".config"), TMPDIR=str(work / "tmp"),
               PYTHONPATH=str(TRANSPORT), PYTHONNOUSERSITE="1", KAGGLE_USERNAME=owner, KAGGLE_KEY="fake-key",
               FAKE_KAGGLE_LOG=str(work / "requests.jsonl"), FAKE_KAGGLE_BLOBS=str(work / "blobs"))
    return env


def run_client(argv: list[str], work: Path, python: Path | str = sys.executable, timeout: float = 1800) -> Upload:
    """Run `argv` (starting with "kaggle"; its `-p` folder holds dataset-metadata.json) with the fake transport;
    `work` (new) receives the blobs, the request log and the client's HOME and TMPDIR."""
    cli = kaggle_cli(python)
    if cli is None:
        raise ClientError(f"no `kaggle` beside {python}: the build environment (requirements/build-cpu.txt) has it")
    folder = Path(argv[argv.index("-p") + 1])
    owner = json.loads((folder / "dataset-metadata.json").read_text())["id"].split("/")[0]
    work.mkdir(parents=True)
    for sub in ("blobs", "home", "tmp", "cwd"):
        (work / sub).mkdir()
    result = subprocess.run([str(cli), *argv[1:]], cwd=work / "cwd", env=client_env(work, owner),
                            capture_output=True, text=True, timeout=timeout)
    log = work / "requests.jsonl"
    entries = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    said = f"\nstdout: {result.stdout[-3000:]}\nstderr: {result.stderr[-3000:]}"
    unexpected = [e for e in entries if "unexpected" in e]
    if result.returncode != 0 or unexpected:
        raise ClientError(f"{' '.join(argv)}: exit status {result.returncode}; unexpected: {unexpected}{said}")
    client = next((e["client"] for e in entries if "client" in e), {})
    calls = tuple(e for e in entries if "client" not in e)
    creates = [e for e in calls if e.get("endpoint") in CREATE_ENDPOINTS]
    if len(creates) != 1 or "is being created" not in result.stdout:
        raise ClientError(f"{' '.join(argv)}: {len(creates)} create requests, and no 'is being created'{said}")
    return Upload(tuple(argv), _blobs(calls), CREATE_ENDPOINTS[creates[0]["endpoint"]], creates[0]["json"], calls,
                  client, work / "blobs", result.stdout)


def _blobs(calls: tuple[dict, ...]) -> tuple[Blob, ...]:
    """Each StartBlobUpload with its PUT (the client uploads one blob at a time) and the token it was answered."""
    starts = [c for c in calls if c.get("endpoint") == "blobs.BlobApiService/StartBlobUpload"]
    puts = [c for c in calls if c.get("method") == "PUT"]
    if [s["json"]["name"] for s in starts] != [p["name"] for p in puts]:
        raise ClientError(f"announced blobs {[s['json']['name'] for s in starts]}, sent {[p['name'] for p in puts]}")
    return tuple(Blob(p["name"], p["bytes"], p["sha256"], s["answer"]["token"]) for s, p in zip(starts, puts))


def upload(folder: Path, work: Path, dir_mode: str = "tar", version_notes: str | None = None,
           python: Path | str = sys.executable) -> Upload:
    """`kaggle datasets create -p folder --dir-mode MODE`, or `kaggle datasets version -p folder -m NOTES --dir-mode
    MODE` when `version_notes` is given."""
    argv = (["kaggle", "datasets", "version", "-p", str(folder), "-m", version_notes] if version_notes is not None
            else ["kaggle", "datasets", "create", "-p", str(folder)])
    return run_client([*argv, "--dir-mode", dir_mode], work, python)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def archive_members(path: Path) -> dict[str, int]:
    """The files of an uploaded archive (tar or zip) with their sizes, by the path the archive stores."""
    if path.suffix == ".zip":
        with zipfile.ZipFile(path) as z:
            return {i.filename: i.file_size for i in z.infolist() if not i.is_dir()}
    with tarfile.open(path) as t:
        return {m.name: m.size for m in t.getmembers() if m.isfile()}


def mount(uploaded: Path, dest: Path, slug: str, unpack: bool) -> Path:
    """`dest/slug` laid out as Kaggle mounts the dataset at /kaggle/input/<slug>/, read-only: the uploaded top-level
    files as they are; each archive either kept as the archive (`unpack` False) or unpacked into a folder named after
    its stem (`unpack` True). Which of the two Kaggle does is not known, so the kit must boot from both."""
    root = dest / slug
    root.mkdir(parents=True)
    for blob in sorted(uploaded.iterdir()):
        if unpack and blob.suffix in ARCHIVES:
            if blob.suffix == ".zip":
                with zipfile.ZipFile(blob) as z:
                    z.extractall(root / blob.stem)
            else:
                with tarfile.open(blob) as t:
                    t.extractall(root / blob.stem, filter="data")
        else:
            shutil.copy2(blob, root / blob.name)
    read_only(root)
    return root


def read_only(root: Path) -> None:
    """Every file 0444 and every folder 0555 under `root`, `root` included (Kaggle mounts input read-only)."""
    for path in sorted(root.rglob("*"), reverse=True):  # contents before their folder
        path.chmod(0o555 if path.is_dir() else 0o444)
    root.chmod(0o555)


def tiny_bundle(root: Path, dataset_id: str = "someone/arc-kit-bundle") -> Path:
    """build.bundle's CPU bundle in `root`/bundle, as tests/test_offline_boot.py builds it: the tiny Qwen3
    (`root`/model) for the cpu-tiny profile, the cpu-py311 target's wheels (fetched into ~/.cache/arc-kit/wheels on
    first use, about 500 MB). Needs torch."""
    from build.bundle.bundler import bundle
    from build.models.tiny import make_checkpoint

    model = make_checkpoint(root / "model", "qwen3", seed=0)
    return bundle("cpu-tiny", model, root / "bundle", target="cpu-py311", dataset_id=dataset_id)
