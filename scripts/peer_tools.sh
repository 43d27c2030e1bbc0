#!/usr/bin/env bash
# The real load tools capplan's commands are tested against (tests/test_loadtools.py, marker
# realtools): a venv with AIPerf 0.13.0 and GuideLLM 0.8.1 and a tiny local tokenizer in
# <venv>/tokenizer (scripts/make_tokenizer.py; no hub download needed).
#
#   scripts/peer_tools.sh            # prints the venv path
#
# Cached by version under ${CAPPLAN_PEERS_DIR:-$HOME/.cache/capplan/peers}; idempotent: a venv
# whose .complete marker (written last) exists is reused as is, a half-built one is rebuilt.
# About 6.5 GB (GuideLLM pulls torch), ~3 min with a warm pip cache. Tests find the venv
# through CAPPLAN_PEERS_VENV, else this default path.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
AIPERF_VERSION=0.13.0
GUIDELLM_VERSION=0.8.1
root="${CAPPLAN_PEERS_DIR:-$HOME/.cache/capplan/peers}"
venv="$root/aiperf-${AIPERF_VERSION}_guidellm-${GUIDELLM_VERSION}"
PY="${PYTHON:-python3}"

if [ ! -f "$venv/.complete" ]; then
  rm -rf "$venv"
  mkdir -p "$root"
  "$PY" -m venv "$venv" >&2
  "$venv/bin/pip" install -q --upgrade pip >&2
  "$venv/bin/pip" install -q "aiperf==${AIPERF_VERSION}" "guidellm==${GUIDELLM_VERSION}" >&2
fi
if [ ! -f "$venv/tokenizer/tokenizer.json" ]; then
  "$venv/bin/python" "$here/make_tokenizer.py" "$venv/tokenizer" >/dev/null
fi
"$venv/bin/aiperf" --version >/dev/null 2>&1 || "$venv/bin/aiperf" --help >/dev/null
"$venv/bin/guidellm" --version >/dev/null
touch "$venv/.complete"
echo "$venv"
