#!/usr/bin/env bash
# needs: 10-apt 20-python
# Builds the root filesystem of the built-in `code-interpreter` template once, into
# $WARREN_CACHE/rootfs/debian12-code-interpreter: the Debian 12 base (same packages, user and sudo rule as
# 40-rootfs.sh) plus Python's Jupyter kernel and the data-science stack from Debian's own packages
# (ipykernel 6.17, jupyter-client 7.4, numpy 1.24, pandas 1.5, matplotlib 3.6), the Bash kernel
# (`bash_kernel` from PyPI, pinned; its dependencies from Debian), the R kernel (Debian's
# r-cran-irkernel, which installs its kernelspec), Node.js (Debian's nodejs, for Warren's own
# JavaScript kernel, which the template's steps add) and the TypeScript compiler (npm's `typescript`,
# pinned by checksum, pure JavaScript) that kernel's TypeScript cells are transpiled with. Template builds on this
# host run offline (build sandboxes have no internet in private network namespaces), so the packages are
# installed here, on the host side, and the server's template builder only adds the interpreter server
# on top. Like the base: built in a temp dir, stamped, renamed into place when complete.
set -euo pipefail
cache=${WARREN_CACHE:-/var/cache/warren}
dest="$cache/rootfs/debian12-code-interpreter"
stamp=".warren-complete"
# Written into the stamp: a rootfs of an older version (other packages) is rebuilt.
version="4: python, bash, r kernels + nodejs + typescript"
mirror=${WARREN_DEBIAN_MIRROR:-http://deb.debian.org/debian}

if [ -f "$dest/$stamp" ] && [ "$(cat "$dest/$stamp")" = "$version" ]; then
    echo "code-interpreter rootfs present: $dest"
    exit 0
fi
if ! command -v mmdebstrap >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap
fi

mkdir -p "$cache/rootfs"
tmp=$(mktemp -d "$cache/rootfs/.debian12-code-interpreter.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# bash_kernel is on PyPI only: its wheel is fetched with the host's pip (the venv of 20-python.sh, which
# trusts the host's certificates; the new rootfs does not yet) and installed offline inside it.
repo=${WARREN_REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
wheels="$tmp/wheels"
"$repo/.venv/bin/pip" download -q --no-deps --only-binary=:all: -d "$wheels" bash_kernel==0.10.0
typescript_version=5.9.3
typescript_sha256=10e108c9cf7d5f2879053dff18515fb405abf2ccef63eaaf017d9c571687a1d3
curl -fsSL -o "$tmp/typescript.tgz" "https://registry.npmjs.org/typescript/-/typescript-$typescript_version.tgz"
echo "$typescript_sha256  $tmp/typescript.tgz" | sha256sum -c --quiet

base=python3,python-is-python3,bash,coreutils,procps,iproute2,curl,git,ca-certificates,sudo
# python3-pip and python3-venv let users `pip install` more inside a sandbox (the PEP 668 marker is
# removed below, as in E2B's image); fonts-dejavu-core gives matplotlib its default font.
kernel=python3-ipykernel,python3-jupyter-client,python3-numpy,python3-pandas,python3-matplotlib,python3-pil,python3-pip,python3-venv,fonts-dejavu-core,python3-pexpect,python3-filetype
# The R kernel and its data frames' HTML; Node.js for JavaScript cells.
kernel="$kernel,r-cran-irkernel,nodejs"
mmdebstrap --variant=minbase --mode=root --include="$base,$kernel" \
    --customize-hook='chroot "$1" groupadd --gid 1000 user' \
    --customize-hook='chroot "$1" useradd --uid 1000 --gid 1000 --create-home --home-dir /home/user --shell /bin/bash user' \
    --customize-hook='echo "user ALL=(ALL:ALL) NOPASSWD: ALL" > "$1/etc/sudoers.d/user" && chmod 0440 "$1/etc/sudoers.d/user"' \
    --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
    --customize-hook="cp $wheels/*.whl \"\$1/tmp/\"" \
    --customize-hook='chroot "$1" sh -c "python3 -m pip install -q --no-deps --no-index --no-cache-dir /tmp/*.whl && rm /tmp/*.whl"' \
    --customize-hook='chroot "$1" python3 -m bash_kernel.install --sys-prefix' \
    --customize-hook="mkdir -p \"\$1/usr/local/lib/node_modules/typescript\" && tar -xzf $tmp/typescript.tgz --no-same-owner -C \"\$1/usr/local/lib/node_modules/typescript\" --strip-components=1" \
    --customize-hook='rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/*' \
    --customize-hook=': > "$1/etc/machine-id"' \
    bookworm "$tmp/root" "$mirror"

sed -i 's/"\$(id -u)"/"${EUID:-$(id -u)}"/g' "$tmp/root/etc/profile"
echo "$version" > "$tmp/root/$stamp"
if [ -e "$dest" ]; then rm -rf "$dest"; fi
mv "$tmp/root" "$dest"
echo "code-interpreter rootfs built: $dest"
