#!/bin/sh
# What tests/gpu/whole_chain.py needs on a GPU machine that has no sshd, no network and none of
# opsctl's own dependencies, fetched here (a Debian 12 machine with network) into one folder
# the device run carries:
#   DIR/debs/    Debian 12's openssh-server, -client, -sftp-server and the packages of every
#                library their binaries load (libc6 apart); the script unpacks them with
#                dpkg -x and puts on LD_LIBRARY_PATH only the libraries the machine lacks
#   DIR/wheels/  wheels of opsctl's runtime dependencies (pyproject's [project.dependencies])
#                and setuptools (pip builds the checkout with it), for CPython 3.12 on
#                manylinux x86_64
#
#   tests/gpu/prepare_whole_chain.sh [DIR]      # DIR default: <checkout>/.gpucarry
#
# DIR is git-ignored locally (.git/info/exclude), never committed. Nothing is installed here.
set -eu
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-$REPO/.gpucarry}
LIMIT_MIB=60

mkdir -p "$OUT/debs" "$OUT/wheels"
OUT=$(cd "$OUT" && pwd)

# the library packages: whoever owns each library sshd, ssh and ssh-keygen load here
libs=$(for f in $(ldd /usr/sbin/sshd /usr/bin/ssh /usr/bin/ssh-keygen | awk '/=>/ {print $3}' | sort -u); do
         dpkg -S "*/$(basename "$f")" 2>/dev/null | head -n 1
       done | cut -d: -f1 | sort -u | grep -vx 'libc6')
rm -f "$OUT"/debs/*.deb
# apt-get download writes into the current directory (as _apt where it can: a folder it may write)
(cd "$OUT/debs" && apt-get download -q openssh-server openssh-client openssh-sftp-server $libs)

rm -f "$OUT"/wheels/*.whl
deps=$(python3 -c 'import sys, tomllib; print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' \
       "$REPO/pyproject.toml")
# one requirement a line: "invoke>=2.2,<3" stays one word
printf '%s\n' "$deps" "setuptools>=68" > "$OUT/wheels/requirements.txt"
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 -d "$OUT/wheels" -r "$OUT/wheels/requirements.txt"

size=$(du -sm "$OUT" | cut -f1)
echo "prepared $OUT: $(ls "$OUT"/debs | wc -l) debs, $(ls "$OUT"/wheels/*.whl | wc -l) wheels, ${size} MiB"
if [ "$size" -gt "$LIMIT_MIB" ]; then
    echo "$OUT is ${size} MiB, over the ${LIMIT_MIB} MiB a device run carries" >&2
    exit 1
fi
