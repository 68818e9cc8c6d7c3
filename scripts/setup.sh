#!/usr/bin/env bash
# Creates .venv (once) and installs keras-vit into it, editable, with the given extras.
#   bash scripts/setup.sh          # the library and CLI
#   bash scripts/setup.sh apps     # plus the desktop app (Qt) and the mobile app's LiteRT.js (npm ci)
#   bash scripts/setup.sh dev      # plus the test tools (pytest, timm, torch, Playwright + Chromium)
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
# Before 0.2.0 this project installed under the distribution name keras-vit (now
# keras-vision-transformers); left in .venv, it would provide a second keras_vit.
if .venv/bin/python -m pip show --quiet keras-vit > /dev/null 2>&1; then
    echo "Removing the old keras-vit distribution from .venv ..."
    .venv/bin/python -m pip uninstall --quiet --yes keras-vit
fi
echo "Installing keras-vit${extras:+ with [$extras]} into .venv ..."
.venv/bin/python -m pip install --quiet --disable-pip-version-check --editable "$spec"

# Root on Debian (CI, containers) installs what is missing; elsewhere the message says what to install.
apt_install() {
    if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
        echo "Installing $* (apt-get) ..."
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" > /dev/null
    else
        echo "Please install $* (Debian: sudo apt-get install $*)." >&2
        return 1
    fi
}

case ",$extras," in
*,apps,* | *,dev,*)
    # The mobile app's front end (LiteRT.js), pinned by apps/mobile/package-lock.json, into a
    # per-user cache (~/.cache/keras-vit), never into the package.
    command -v npm > /dev/null || apt_install nodejs npm
    echo "Installing the mobile app's front end (npm ci into ~/.cache/keras-vit) ..."
    .venv/bin/python -c 'from keras_vit.apps.mobile.build import ensure_front_end; print(ensure_front_end())'
    ;;
esac
case ",$extras," in
*,dev,*)
    # The mobile app's tests drive Debian's Chromium with Playwright.
    command -v chromium > /dev/null || apt_install chromium
    ;;
esac
