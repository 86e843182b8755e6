"""submission/kaggle/bundle_files.py: a kit dataset boots from whatever Kaggle mounts for each top-level folder (the
folder, or the .tar / .zip the Kaggle client uploaded it as), every extracted file hashed against the manifest; split
files are joined into a view of links, so the disk written is what the preflight counts."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import zipfile
from pathlib import Path

import pytest

from submission.kaggle.bundle_files import (disk_needed, join_split_files, manifest_problems, materialise, split_parts,
                                     top_levels)

FILES = {"wheels/a-1.0-py3-none-any.whl": b"wheel a" * 1000, "wheels/b-2.0-py3-none-any.whl": b"wheel b",
         "kit/bundle.json": b'{"profile": "cpu-tiny"}', "kit/submission/kaggle/boot.py": b"print('boot')\n",
         "model/config.json": b"{}", "model/model.safetensors.part000": b"x" * 300,
         "model/model.safetensors.part001": b"y" * 100}


def make_bundle(root: Path) -> Path:
    bundle = root / "bundle"
    for name, data in FILES.items():
        (bundle / name).parent.mkdir(parents=True, exist_ok=True)
        (bundle / name).write_bytes(data)
    files = {name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in FILES.items()}
    (bundle / "manifest.json").write_text(json.dumps({"files": files, "split_part_suffix": ".part"}))
    return bundle


def archived(bundle: Path, dest: Path, mode: str, folders: tuple[str, ...]) -> Path:
    """The mount Kaggle gives when it keeps the client's archives (kaggle's DirectoryArchive: members relative to the
    folder, files only), the other folders unpacked."""
    dest.mkdir()
    for top in top_levels(json.loads((bundle / "manifest.json").read_text())) + ["manifest.json"]:
        if top not in folders:
            (dest / top).symlink_to(bundle / top)
            continue
        files = sorted(p for p in (bundle / top).rglob("*") if p.is_file())
        if mode == "zip":
            with zipfile.ZipFile(dest / f"{top}.zip", "w", zipfile.ZIP_DEFLATED) as z:
                for path in files:
                    z.write(path, path.relative_to(bundle / top))
        else:
            with tarfile.open(dest / f"{top}.tar", "w") as t:
                for path in files:
                    t.add(path, str(path.relative_to(bundle / top)))
    return dest


def test_folders_as_mounted_are_used_in_place(tmp_path):
    bundle = make_bundle(tmp_path)
    assert materialise(bundle, tmp_path / "work") == (bundle, [])
    assert not (tmp_path / "work").exists()  # nothing written


@pytest.mark.parametrize("mode", ["tar", "zip"])
def test_archives_kept_by_kaggle_are_extracted_and_checked(tmp_path, mode):
    bundle = make_bundle(tmp_path)
    mount = archived(bundle, tmp_path / "mount", mode, ("wheels", "model", "kit"))
    view, problems = materialise(mount, tmp_path / "work")
    assert problems == [] and view == tmp_path / "work" / "bundle"
    assert manifest_problems(view) == []
    assert not (view / "kit").is_symlink() and (view / "manifest.json").is_symlink()


def test_a_mix_of_folders_and_archives_links_the_folders(tmp_path):
    bundle = make_bundle(tmp_path)
    mount = archived(bundle, tmp_path / "mount", "tar", ("model",))
    view, problems = materialise(mount, tmp_path / "work")
    assert problems == [] and manifest_problems(view) == []
    assert (view / "wheels").is_symlink() and not (view / "model").is_symlink()


def test_a_corrupt_archive_member_is_named(tmp_path):
    bundle = make_bundle(tmp_path)
    (bundle / "wheels" / "b-2.0-py3-none-any.whl").write_bytes(b"wheel c")  # same size, other bytes
    (bundle / "wheels" / "a-1.0-py3-none-any.whl").unlink()
    mount = archived(bundle, tmp_path / "mount", "tar", ("wheels",))
    assert materialise(mount, tmp_path / "work")[1] == ["sha256 differs: wheels.tar:b-2.0-py3-none-any.whl",
                                                        "missing: wheels.tar:a-1.0-py3-none-any.whl"]


def test_a_member_outside_its_folder_is_refused(tmp_path):
    from submission.kaggle.bundle_files import BundleError

    bundle = make_bundle(tmp_path)
    mount = archived(bundle, tmp_path / "mount", "tar", ("kit",))
    (mount / "kit.tar").unlink()
    with tarfile.open(mount / "kit.tar", "w") as t:
        t.add(bundle / "kit" / "bundle.json", "../escaped.json")
    with pytest.raises(BundleError, match="outside its folder"):
        materialise(mount, tmp_path / "work")


def test_split_files_are_joined_into_links_and_only_the_joined_file_is_written(tmp_path):
    bundle = make_bundle(tmp_path)
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert split_parts(manifest) == {"model/model.safetensors": ["model/model.safetensors.part000",
                                                                 "model/model.safetensors.part001"]}
    joined = join_split_files(bundle, tmp_path / "work")
    assert (joined / "model" / "model.safetensors").read_bytes() == b"x" * 300 + b"y" * 100
    written = [p for p in (tmp_path / "work").rglob("*") if p.is_file() and not p.is_symlink()]
    assert written == [joined / "model" / "model.safetensors"]
    assert (joined / "model" / "config.json").is_symlink() and (joined / "wheels").is_symlink()
    assert not (joined / "model" / "model.safetensors.part000").exists()


def test_the_disk_needed_is_what_extraction_and_joining_write(tmp_path):
    bundle = make_bundle(tmp_path)
    manifest = json.loads((bundle / "manifest.json").read_text())
    wheels = len(FILES["wheels/a-1.0-py3-none-any.whl"]) + len(FILES["wheels/b-2.0-py3-none-any.whl"])
    assert disk_needed(manifest, set()) == 400  # the joined file only
    assert disk_needed(manifest, {"wheels"}) == 400 + wheels
    mount = archived(bundle, tmp_path / "mount", "tar", ("wheels", "model"))
    view, _ = materialise(mount, tmp_path / "work")
    join_split_files(view, tmp_path / "work")
    written = sum(p.stat().st_size for p in (tmp_path / "work").rglob("*") if p.is_file() and not p.is_symlink())
    assert written == disk_needed(manifest, {"wheels", "model"})
