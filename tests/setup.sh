#!/usr/bin/env bash
# Installs what berth's build, tests and benchmarks need on a Debian machine. Idempotent and
# quick when everything is present: it only calls apt-get or pip for what is missing.
# `tests/setup.sh build` installs only what the Rust build compiles and links against, so the
# build can start while the rest is installed (tests/test.sh does that).
set -euo pipefail

build_packages=(
  build-essential pkg-config libssl-dev  # the Rust build (native-tls)
  nasm                                   # openh264's assembly kernels, before the first cargo build
  libturbojpeg0-dev libwebp-dev          # screenshot encoders
)
packages=(
  curl ca-certificates jq                # the demo; the README's curl examples
  python3 python3-pip                    # /run_python, the pyautogui shim, the Flask peer
  procps util-linux passwd               # tests: process table, setsid, useradd
  xvfb xfwm4 xfce4-panel xfdesktop4 xfconf dbus-x11 x11-utils xauth  # a real display and desktop
  python3-tk python3-xlib                # Tk test windows, pyautogui's needs
  scrot xdotool xclip                    # benchmark peers; a second clipboard client
  ffmpeg                                 # judges recordings (ffprobe, decoding); recording peer
  tigervnc-standalone-server novnc       # the desktop: Xvnc and the noVNC viewer
  libjs-xterm node-xterm                 # the session view's terminal (xterm.js; node-xterm holds its modules)
  xfce4-settings at-spi2-core dbus chromium  # its settings daemon, AT-SPI bus, session bus, browser
  xfce4-terminal                         # a terminal for /terminal
  python3-pyatspi python3-lxml           # the accessibility benchmark's peer (OSWorld's way)
  debootstrap                            # the image builder's base rootfs
  docker-registry                        # a local registry for `berth image push` (tests/tests/registry.rs)
  apache2-utils                          # htpasswd: that registry's password file
  runsc                                  # gVisor, the second kernel `[runtime]` can ask for (tests/tests/gvisor.rs)
  patchelf                               # the image builder: a brought image's agent finds its own libraries
  busybox-static musl                    # tests: an Alpine-shaped root file system (musl, busybox) for brought images
)

sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"

# Installs the named Debian packages that are not installed yet.
apt_install() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

apt_install "${build_packages[@]}"
[ "${1:-}" = build ] && exit 0
apt_install "${packages[@]}"

# The benchmark's peer server, and requests (OSWorld's client) for its cross-check.
if ! python3 -c 'import flask, requests' 2>/dev/null; then
  echo "setup: installing Flask and requests" >&2
  python3 -m pip install --quiet flask requests 2>/dev/null \
    || python3 -m pip install --quiet --break-system-packages flask requests
fi

# pyautogui for Debian's python3: OSWorld's harness sends `python -c "import pyautogui; ..."`.
has() { "$1" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$2') is None)" 2>/dev/null; }
if ! has /usr/bin/python3 pyautogui; then
  echo "setup: installing pyautogui" >&2
  /usr/bin/python3 -m pip install --quiet --break-system-packages pyautogui 2>/dev/null \
    || { $sudo apt-get install -y -qq --no-install-recommends python3-pip >/dev/null \
         && /usr/bin/python3 -m pip install --quiet --break-system-packages pyautogui; }
fi
# Pillow for the benchmark's peers (scrot + Pillow, Pillow's ImageGrab).
if ! has python3 PIL; then
  echo "setup: installing Pillow" >&2
  python3 -m pip install --quiet pillow 2>/dev/null \
    || python3 -m pip install --quiet --break-system-packages pillow
fi

# Playwright for Python drives the desktop's Chromium over CDP in the tests (no browser
# download: it connects to the running one).
if ! has python3 playwright; then
  echo "setup: installing Playwright for Python" >&2
  python3 -m pip install --quiet playwright 2>/dev/null \
    || python3 -m pip install --quiet --break-system-packages playwright
fi

# schemathesis fuzzes both /openapi.json documents (tests/tests/schemathesis.rs); pinned so the
# CLI's options and check names stay as the test spells them.
schemathesis_version=4.32.5
if [ "$(python3 -c 'import importlib.metadata as m; print(m.version("schemathesis"))' 2>/dev/null)" != "$schemathesis_version" ]; then
  echo "setup: installing schemathesis $schemathesis_version" >&2
  python3 -m pip install --quiet "schemathesis==$schemathesis_version" 2>/dev/null \
    || python3 -m pip install --quiet --break-system-packages "schemathesis==$schemathesis_version"
fi

# The official MCP Python SDK drives the agent's /mcp in tests/tests/mcp.rs; pinned so its client
# API stays as tests/mcp/client.py spells it.
mcp_version=2.3.0
if [ "$(python3 -c 'import importlib.metadata as m; print(m.version("mcp"))' 2>/dev/null)" != "$mcp_version" ]; then
  echo "setup: installing mcp $mcp_version" >&2
  python3 -m pip install --quiet "mcp==$mcp_version" 2>/dev/null \
    || python3 -m pip install --quiet --break-system-packages "mcp==$mcp_version"
fi

# The anthropic SDK's computer toolset classes, which berth.anthropic's drivers subclass
# (clients/python/tests/test_toolsets.py, run by tests/tests/toolsets.rs); pinned to the release
# whose toolset results berth answers to the text.
anthropic_version=2.10.0
if [ "$(python3 -c 'import importlib.metadata as m; print(m.version("anthropic"))' 2>/dev/null)" != "$anthropic_version" ]; then
  echo "setup: installing anthropic $anthropic_version" >&2
  python3 -m pip install --quiet "anthropic==$anthropic_version" 2>/dev/null \
    || python3 -m pip install --quiet --break-system-packages "anthropic==$anthropic_version"
fi

# Independent readers of what the workpiece engine (LibreOffice, PyMuPDF) wrote, for
# tests/workpieces/client.py: none of them is the code that wrote the files.
readers=(openpyxl==3.1.5 python-docx==1.2.0 python-pptx==1.0.2 pdfplumber==0.11.11 pypdf==7.1.1)
if ! python3 -c 'import openpyxl, docx, pptx, pdfplumber, pypdf' 2>/dev/null; then
  echo "setup: installing ${readers[*]}" >&2
  python3 -m pip install --quiet "${readers[@]}" 2>/dev/null \
    || python3 -m pip install --quiet --break-system-packages "${readers[@]}"
fi

if ! command -v cargo-nextest >/dev/null 2>&1; then
  echo "setup: installing cargo-nextest" >&2
  cargo install --locked cargo-nextest
fi

# mdBook builds the book under docs/ (tests/tests/docs.rs); pinned, with its search and without
# its server and file watcher. About 3 minutes to compile on this project's 2-core machine.
mdbook_version=0.5.4
if [ "$(mdbook --version 2>/dev/null)" != "mdbook v$mdbook_version" ]; then
  echo "setup: installing mdbook $mdbook_version" >&2
  cargo install mdbook --locked --version "$mdbook_version" --no-default-features --features search
fi

# cargo-fuzz for tests/fuzz.sh; its targets build on the nightly toolchain.
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  echo "setup: installing the nightly toolchain" >&2
  rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "setup: installing cargo-fuzz" >&2
  cargo install --locked cargo-fuzz
fi

# OSWorld's harness for clients/python's tests (tests/tests/osworld.rs): desktop-env from PyPI
# without its dependencies (they run to torch and more), then only what its controllers, setup
# controller and getters import, the metric modules the tests use (vscode: PyPDF2; general and
# basic_os), and pytest.
osworld_deps=(
  "gymnasium=gymnasium~=0.28.1" "pydrive=pydrive" "requests_toolbelt=requests-toolbelt~=1.0.0"
  "dotenv=python-dotenv" "lxml=lxml" "cssselect=cssselect" "pandas=pandas>=2.2,<2.3"
  "pytz=pytz" "PyPDF2=PyPDF2" "openpyxl=openpyxl" "formulas=formulas" "tldextract=tldextract"
  "xmltodict=xmltodict" "pytest=pytest"
  # OSWorld's general metrics (exact_match, check_include_exclude) for the GNOME image's tasks.
  "pdfplumber=pdfplumber" "yaml=pyyaml" "docx=python-docx" "rapidfuzz=rapidfuzz"
)
osworld_missing=()
for d in "${osworld_deps[@]}"; do
  has python3 "${d%%=*}" || osworld_missing+=("${d#*=}")
done
if [ ${#osworld_missing[@]} -gt 0 ]; then
  echo "setup: installing ${osworld_missing[*]}" >&2
  python3 -m pip install --quiet "${osworld_missing[@]}" "numpy>=1.26,<2" 2>/dev/null \
    || python3 -m pip install --quiet --break-system-packages "${osworld_missing[@]}" "numpy>=1.26,<2"
fi
if ! has python3 desktop_env; then
  echo "setup: installing desktop-env (without its dependencies)" >&2
  python3 -m pip install --quiet --no-deps desktop-env==1.0.2 2>/dev/null \
    || python3 -m pip install --quiet --no-deps --break-system-packages desktop-env==1.0.2
fi
# The berth package itself, editable, from this clone.
berth_python="$(cd "$(dirname "$0")/.." && pwd)/clients/python"
if [ "$(python3 -c 'import berth, os; print(os.path.dirname(os.path.dirname(os.path.realpath(berth.__file__))))' 2>/dev/null)" != "$berth_python" ]; then
  echo "setup: installing the berth Python package from $berth_python" >&2
  python3 -m pip install --quiet --no-deps -e "$berth_python" 2>/dev/null \
    || python3 -m pip install --quiet --no-deps --break-system-packages -e "$berth_python"
fi

# Harbor (PyPI `harbor`, Python >= 3.12) and the `atif` models in a virtual environment of their
# own, with the berth package (editable) beside them: tests/tests/harbor.rs runs `harbor run` on
# berth, and the ATIF export is validated with `atif`'s models. Python 3.12 from the machine's
# pyenv when the system's python3 is older.
harbor_version=0.26.0
harbor_venv=/opt/berth/harbor-venv
if [ "$("$harbor_venv/bin/python" -c 'import importlib.metadata as m; print(m.version("harbor"), m.version("atif"))' 2>/dev/null)" != "$harbor_version 1.8.0" ] \
  || [ "$("$harbor_venv/bin/python" -c 'import berth.harbor, os; print(os.path.dirname(os.path.dirname(os.path.realpath(berth.__file__))))' 2>/dev/null)" != "$berth_python" ]; then
  py312=""
  for p in python3.13 python3.12 "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/3.1[23]*/bin/python3; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      py312="$(command -v "$p")"; break
    fi
  done
  [ -n "$py312" ] || { echo "setup: Harbor needs Python >= 3.12 (none found)" >&2; exit 1; }
  echo "setup: installing harbor $harbor_version and atif 1.8.0 into $harbor_venv ($py312)" >&2
  $sudo mkdir -p "$(dirname "$harbor_venv")"
  [ -x "$harbor_venv/bin/python" ] || $sudo "$py312" -m venv "$harbor_venv"
  $sudo "$harbor_venv/bin/python" -m pip install --quiet "harbor==$harbor_version" "atif==1.8.0"
  $sudo "$harbor_venv/bin/python" -m pip install --quiet --no-deps -e "$berth_python"
fi

# gVisor registered with the Docker daemon as the runtime `runsc`, once: added to daemon.json
# (every other key kept) and loaded with SIGHUP (runtimes are reloadable; running containers are
# not touched). This runsc takes any container's network namespace for the host's and refuses
# to start its own network stack there, so it uses the container's (`--network=host`: the
# container's namespace and address, not the host's).
if [ "$(id -u)" = 0 ] && docker info >/dev/null 2>&1 \
  && ! docker info --format '{{json .Runtimes}}' | grep -q '"runsc"'; then
  echo "setup: registering runsc with the Docker daemon" >&2
  python3 - /etc/docker/daemon.json <<'PY'
import json, os, sys
path = sys.argv[1]
cfg = json.load(open(path)) if os.path.exists(path) and os.path.getsize(path) else {}
cfg.setdefault("runtimes", {})["runsc"] = {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=host"]}
tmp = path + ".berth-tmp"
with open(tmp, "w") as f:
    json.dump(cfg, f, indent=2)
os.chmod(tmp, 0o644)
os.replace(tmp, path)
PY
  kill -HUP "$(pidof dockerd)"
  for _ in $(seq 100); do
    docker info --format '{{json .Runtimes}}' | grep -q '"runsc"' && break
    sleep 0.1
  done
  docker info --format '{{json .Runtimes}}' | grep -q '"runsc"' \
    || { echo "setup: the Docker daemon did not take the runsc runtime" >&2; exit 1; }
fi
