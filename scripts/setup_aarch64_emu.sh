#!/usr/bin/env bash
# Builds an emulated aarch64 Python with the aarch64 TVM wheels under .emu/aarch64 (idempotent).
#
#   .emu/aarch64/root   Debian bookworm arm64 minbase + python3, unpacked with dpkg-deb -x
#   .emu/aarch64/site   aarch64 wheels (TVM, tvm-ffi, numpy, ...) unzipped, for PYTHONPATH
#   .emu/aarch64/.complete  written last; holds the fingerprint of this recipe
#   .emu/cache/{debs,wheels}  downloads kept between runs, so a redo needs little network
#
# Run it as: QEMU_LD_PREFIX=.emu/aarch64/root PYTHONPATH=.emu/aarch64/site \
#   qemu-aarch64-static .emu/aarch64/root/usr/bin/python3.11 script.py
# No binfmt registration, chroot or root rights are needed: debootstrap only downloads.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
EMU=${DYNSHAPE_EMU_DIR:-$REPO/.emu}
DEST=$EMU/aarch64
CACHE=$EMU/cache
STAMP=$DEST/.complete
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
DEB_INCLUDE=python3,libstdc++6
# The same pins as requirements.txt: the emulated side must run what the x86 side runs.
WHEELS=(apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post1 numpy==2.4.6 ml_dtypes==0.6.0
  typing_extensions==4.16.0)
PLATFORMS=(manylinux_2_28_aarch64 manylinux_2_27_aarch64 manylinux_2_17_aarch64
  manylinux2014_aarch64)
PIP=${PIP:-}
if [ -z "$PIP" ]; then
  if [ -x "$REPO/.venv/bin/python" ]; then PIP="$REPO/.venv/bin/python -m pip"; else PIP="python3 -m pip"; fi
fi

FINGERPRINT="suite=$SUITE include=$DEB_INCLUDE wheels=${WHEELS[*]}"
started=$SECONDS

for tool in debootstrap dpkg-deb unzip qemu-aarch64-static; do
  command -v "$tool" >/dev/null || { echo "setup_aarch64_emu: $tool is missing (make system-deps)" >&2; exit 1; }
done

mkdir -p "$EMU" "$CACHE/debs" "$CACHE/wheels"
exec 9>"$EMU/.lock"
flock 9

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$FINGERPRINT" ]; then
  echo "setup_aarch64_emu: $DEST is complete"
  exit 0
fi
if [ -e "$DEST" ]; then
  echo "setup_aarch64_emu: removing an incomplete or outdated $DEST"
  rm -rf "$DEST"
fi
mkdir -p "$DEST/root" "$DEST/site"

# 1. Debian arm64 packages. --download-only resolves minbase plus python3 without needing root
#    or binfmt (the second stage would have to run aarch64 code); debs already in the cache
#    with the right checksum are not fetched again.
echo "setup_aarch64_emu: debootstrap --download-only $SUITE arm64"
debootstrap --download-only --arch=arm64 --variant=minbase --include="$DEB_INCLUDE" \
  --cache-dir="$CACHE/debs" "$SUITE" "$DEST/root" "$MIRROR" >"$DEST/debootstrap.log" 2>&1 \
  || { tail -n 20 "$DEST/debootstrap.log" >&2; exit 1; }
debs=$(awk '{print $2}' "$DEST/root/debootstrap/debpaths")
echo "setup_aarch64_emu: unpacking $(wc -w <<<"$debs") debs"
(cd "$DEST/root" && printf '%s\n' $debs | sed 's#^/##' | xargs -P "$(nproc)" -n 8 sh -c \
  'for d; do dpkg-deb -x "$d" .; done' sh)
rm -rf "$DEST/root/var/cache/apt/archives" "$DEST/root/debootstrap"
test -x "$DEST/root/usr/bin/python3.11" || { echo "setup_aarch64_emu: no python3.11 in the rootfs" >&2; exit 1; }

# 2. aarch64 wheels for CPython 3.11: offline from the cache when it holds them all.
pip_args=(download --no-deps --only-binary=:all: --python-version 3.11 --implementation cp
  --dest "$CACHE/wheels" --quiet)
for p in "${PLATFORMS[@]}"; do pip_args+=(--platform "$p"); done
if ! $PIP "${pip_args[@]}" --no-index --find-links "$CACHE/wheels" "${WHEELS[@]}" 2>/dev/null; then
  echo "setup_aarch64_emu: pip download ${WHEELS[*]}"
  $PIP "${pip_args[@]}" "${WHEELS[@]}"
fi
for spec in "${WHEELS[@]}"; do
  name=${spec%%==*}
  version=${spec#*==}
  # Wheel file names normalise '-' to '_'; match case-insensitively on the normalised name.
  wheel=$(find "$CACHE/wheels" -maxdepth 1 -iname "${name//-/_}-${version}-*.whl" \
    \( -name '*aarch64*' -o -name '*-none-any.whl' \) | sort | tail -n 1)
  [ -n "$wheel" ] || { echo "setup_aarch64_emu: no aarch64 wheel for $spec in $CACHE/wheels" >&2; exit 1; }
  unzip -q -o "$wheel" -d "$DEST/site"
done

printf '%s' "$FINGERPRINT" >"$STAMP"
echo "setup_aarch64_emu: done in $((SECONDS - started)) s ($(du -sh "$DEST" | cut -f1))"
