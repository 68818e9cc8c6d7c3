#!/usr/bin/env bash
# Creates .venv (once) and installs keras-vit into it, editable, with the given extras.
#   bash scripts/setup.sh          # the library and CLI
#   bash scripts/setup.sh dev      # plus the test tools (pytest, timm, torch)
set -euo pipefail
cd "$(dirname "$0")/.."

extras="${1:-}"
python="${PYTHON:-python3}"
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || {
    echo "keras-vit needs Python 3.10 or newer; $python is $("$python" --version 2>&1)." >&2
    exit 1
}
[ -x .venv/bin/python ] || "$python" -m venv .venv
spec="."
[ -n "$extras" ] && spec=".[$extras]"
echo "Installing keras-vit${extras:+ with [$extras]} into .venv ..."
.venv/bin/python -m pip install --quiet --disable-pip-version-check --editable "$spec"
