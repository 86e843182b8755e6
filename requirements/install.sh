#!/usr/bin/env bash
# Set up one cached environment: requirements/install.sh PYTHON VENV REQUIREMENTS [PACKAGES TO REMOVE...]
# The folder name already holds the hash of the requirement files, so a finished environment (its .installed stamp)
# is never rebuilt, whatever the files' mtimes (a fresh clone's are always newer). Two clones setting up the same
# environment at once are serialised by a lock; the second finds the stamp and returns. A half-built folder (an
# interrupted install) is removed and built again. pip runs without --quiet: one line per package with its size.
set -euo pipefail
python=$1 venv=$2 req=$3; shift 3
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if [ -f "$venv/.installed" ]; then exit 0; fi
rm -rf "$venv"
echo "== setting up $venv from $req (first time on this machine only)"
"$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
# torch first, alone, at the environment's own pin: with no torch installed, a dependency asking for a torch range
# could pull a CUDA build.
torch=$(grep -h '^torch==' "$req" || true)
if [ -n "$torch" ]; then
    echo "== $venv: $torch (CPU build)"
    "${pip[@]}" install --progress-bar off "$torch"
fi
echo "== $venv: -r $req"
"${pip[@]}" install --progress-bar off -r "$req"
if [ $# -gt 0 ]; then
    echo "== $venv: removing $* (they fail to import beside this torch)"
    "${pip[@]}" uninstall --yes "$@"
fi
touch "$venv/.installed"
echo "== $venv ready ($(du -sh "$venv" | cut -f1))"
