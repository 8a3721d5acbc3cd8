#!/usr/bin/env bash
# Build a wheel of this tree, install it (not editable) into a fresh virtualenv and run
# .ci/wheel_check.py from outside the source tree.
# usage: bash .ci/wheel_check.sh PYTHON   (a Python with torch, numpy and safetensors)
# The new virtualenv reuses PYTHON's installed packages (torch, ...) through a .pth line
# and installs only the wheel itself into its own site-packages, which come first on
# sys.path, so `import oscar_kernels` there is the wheel's copy (the check asserts so).
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD
PY=${1:-python3}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
start=$(date +%s)
"$PY" -m pip install -q "setuptools>=64" wheel
# build from a copy of the files git sees, so no stale build/ or egg-info of the tree gets in
mkdir "$TMP/src"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git ls-files -z --cached --others --exclude-standard \
    | tar -c --null --ignore-failed-read -T - -f - 2>/dev/null | tar -x -C "$TMP/src" -f -
else
  cp -a . "$TMP/src"
fi
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$TMP/dist" "$TMP/src"
"$PY" -m venv "$TMP/venv"
"$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
  > "$("$TMP/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/ci_reuse.pth"
"$TMP/venv/bin/python" -m pip install -q --no-deps "$TMP"/dist/oscar_kernels-*.whl
cd "$TMP"
"$TMP/venv/bin/python" "$SRC/.ci/wheel_check.py" --source "$SRC"
echo "wheel check: $(( $(date +%s) - start )) s"
