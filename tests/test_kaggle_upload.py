"""The bundle as the real `kaggle` client uploads it (issue 27): build.bundle's CPU bundle, the exact commands that
build.bundle's upload_advice prints run by the pinned client (kaggle 2.2.5) with only its HTTP transport faked
(tests/kaggle_client.py), what it sent laid out as Kaggle mounts it, checked file by file against the manifest.

`--dir-mode tar` (build.bundle.bundler.DIR_MODE) sends manifest.json and one archive per top-level folder (kit.tar,
model.tar, wheels.tar), never dataset-metadata.json; without --dir-mode the client sends manifest.json alone. Tar
rather than zip, measured on this CPU bundle (541 MB in 129 files; the client's whole run with the fake transport,
2 shared cores, two runs each): tar 1.8-5.6 s for 541.2 MB sent, zip 25-28 s for 530.6 MB (2% smaller: wheels and
safetensors hardly compress). Zip's DEFLATE, one core at ~50 s per GB, would add about 40 minutes to a 50 GB bundle.
Needs the build environment (the client is pinned there) and the CPU target's wheels (fetched into
~/.cache/arc-kit/wheels on first use: about 500 MB)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the tiny model needs torch (the build environment)")

from build.bundle.bundler import CLIENT_IGNORES, DIR_MODE, bundle, client_ignored, upload_commands, verify  # noqa: E402
from kaggle_client import archive_members, kaggle_cli, mount, run_client, tiny_bundle, upload  # noqa: E402
from submission.kaggle.boot import manifest_problems  # noqa: E402

if kaggle_cli() is None:
    pytest.skip("no `kaggle` client in this environment: the build environment pins it", allow_module_level=True)

SLUG = "arc-kit-bundle"
FOLDERS = ["kit", "model", "wheels"]  # the CPU bundle's top-level folders


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return tiny_bundle(tmp_path_factory.mktemp("kaggle-upload"))


@pytest.fixture(scope="module")
def created(built, tmp_path_factory):
    """`kaggle datasets create` as build.bundle's advice prints it, run on the bundle."""
    return run_client(upload_commands(built)[0], tmp_path_factory.mktemp("create") / "work")


def manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.timeout(900)
def test_create_sends_the_manifest_and_one_archive_per_folder(built, created):
    assert verify(built) == []  # dataset-metadata.json is in the folder for the client, not in the manifest
    assert "dataset-metadata.json" not in manifest(built)["files"]
    assert created.argv == ("kaggle", "datasets", "create", "-p", str(built), "--dir-mode", DIR_MODE)
    assert created.client["version"] == "2.2.5" and "site-packages" in created.client["file"]
    assert created.names == sorted(["manifest.json"] + [f"{folder}.{DIR_MODE}" for folder in FOLDERS])
    endpoints = [r.get("endpoint") for r in created.requests if r["method"] == "POST"]
    assert endpoints[0] == "datasets.DatasetApiService/GetDatasetStatus"  # the slug is checked first: free (404)
    assert endpoints[-1] == "datasets.DatasetApiService/CreateDataset"
    assert created.create["ownerSlug"] == "someone" and created.create["slug"] == SLUG
    assert created.create["isPrivate"] and created.create["licenseName"] == "other"
    assert sorted(created.file_tokens) == sorted(blob.token for blob in created.blobs)  # one token per file
    assert len(set(created.file_tokens)) == len(created.blobs)
    sent = {blob.name: blob for blob in created.blobs}
    assert sent["manifest.json"].bytes == (built / "manifest.json").stat().st_size
    assert (created.folder / "manifest.json").read_bytes() == (built / "manifest.json").read_bytes()


@pytest.mark.timeout(900)
def test_the_unpacked_upload_is_the_manifest_exactly(built, created, tmp_path):
    root = mount(created.folder, tmp_path / "input", SLUG, unpack=True)
    assert manifest_problems(root) == []  # every listed file there, sizes and sha256 equal
    assert files_under(root) == sorted([*manifest(root)["files"], "manifest.json"])  # and nothing else
    assert all(not p.stat().st_mode & 0o222 for p in [root, *root.rglob("*")])  # mounted read-only


@pytest.mark.timeout(900)
def test_archives_kept_as_archives_hold_the_manifest_files(built, created, tmp_path):
    root = mount(created.folder, tmp_path / "input", SLUG, unpack=False)
    assert files_under(root) == created.names
    listed = manifest(built)["files"]
    for folder in FOLDERS:  # member paths relative to the folder, every listed file of it at its listed size
        members = archive_members(root / f"{folder}.{DIR_MODE}")
        assert {f"{folder}/{name}": size for name, size in members.items()} == \
            {name: entry["bytes"] for name, entry in listed.items() if name.startswith(f"{folder}/")}


@pytest.mark.timeout(900)
def test_a_new_version_sends_the_same_files(built, created, tmp_path):
    version = run_client(upload_commands(built, "smaller model")[1], tmp_path / "work")
    assert version.argv == ("kaggle", "datasets", "version", "-p", str(built), "-m", "smaller model",
                            "--dir-mode", DIR_MODE)
    assert version.endpoint == "CreateDatasetVersion"
    assert not any(r.get("endpoint", "").endswith("GetDatasetStatus") for r in version.requests)
    assert (version.create["ownerSlug"], version.create["datasetSlug"]) == ("someone", SLUG)
    assert version.create["body"]["versionNotes"] == "smaller model"
    assert version.names == created.names
    assert sorted(version.file_tokens) == sorted(blob.token for blob in version.blobs)
    root = mount(version.folder, tmp_path / "input", SLUG, unpack=True)
    assert manifest_problems(root) == [] and files_under(root) == sorted([*manifest(root)["files"], "manifest.json"])


@pytest.mark.timeout(900)
def test_without_dir_mode_the_client_sends_only_the_manifest(built, tmp_path):
    """Why the README's commands say --dir-mode: the client's default ("skip") leaves every folder behind."""
    skipped = upload(built, tmp_path / "work", "skip")
    assert skipped.names == ["manifest.json"] and len(skipped.file_tokens) == 1
    assert all(f"Skipping folder: {folder};" in skipped.stdout for folder in FOLDERS)


@pytest.mark.timeout(300)
def test_paths_the_client_leaves_out_are_known_and_refused(built, created, tmp_path):
    assert list(CLIENT_IGNORES) == created.client["ignore_patterns"]
    # build.bundle's reading of the patterns against the client's own archives
    paths = ["manifest.json", "model/w.bin", "model/.cache/huggingface/a.metadata", "model/sub/.cache/b",
             "model/sub/.git/HEAD", "model/.gitignore", "kit/.huggingface/c", "kit/x/.huggingface/d",
             ".cache/e", ".git/f"]
    folder = tmp_path / "dataset"
    for path in paths:
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(path)
    shutil.copy(built / "dataset-metadata.json", folder)
    sent = upload(folder, tmp_path / "work", DIR_MODE)
    arrived = ["manifest.json"] + [f"{archive[:-len(DIR_MODE) - 1]}/{member}" for archive in sent.names
                                   if archive != "manifest.json"
                                   for member in archive_members(sent.folder / archive)]
    assert sorted(arrived) == sorted(path for path in paths if not client_ignored(path))
    assert sorted(set(paths) - set(arrived)) == [".cache/e", ".git/f", "kit/.huggingface/c",
                                                 "model/.cache/huggingface/a.metadata", "model/sub/.git/HEAD"]
    # a checkpoint as `hf download --local-dir` leaves it is refused before anything is copied
    model = tmp_path / "checkpoint"
    shutil.copytree(built / "model", model)
    (model / ".cache" / "huggingface").mkdir(parents=True)
    (model / ".cache" / "huggingface" / "model.safetensors.metadata").write_text("x")
    with pytest.raises(ValueError, match=r"model/\.cache/huggingface/model\.safetensors\.metadata .*'\.cache/'"):
        bundle("cpu-tiny", model, tmp_path / "refused", target="cpu-py311")
    assert not (tmp_path / "refused").exists() and not (tmp_path / "refused.partial").exists()
