#!/usr/bin/env bash
# needs: 10-apt
# CRIU 4.1.1 (checkpoint/restore of sandboxes). Debian 12's criu 3.17 cannot start on newer kernels
# ("vdso: Failed to fill self vdso symtable"), so build 4.1.1 from Debian 13's source tarball, fetched
# through apt with a private config (the system's apt sources stay untouched), and install the binary as
# /usr/local/sbin/criu, with the small patches in criu-patches/ (each says why). Cached: does nothing
# when that binary reports 4.1.1 and the stamp next to it names the same patch set.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=4.1.1
tarball=criu_${version}.orig.tar.xz
tarball_sha256=f80a66cb3726bb2116266d4759ce3bcbfab7abdb6b6d430bf20dd41911717afe
cache=${WARREN_CACHE:-/var/cache/warren}/criu
dest=/usr/local/sbin/criu
stamp=/usr/local/share/warren/criu.build
patches=("$here"/criu-patches/*.patch)
# CRIU caches what it probes of the kernel (kdat) in RUNDIR, but only on a tmpfs; /run is not one on
# every host (nor here), and without the cache every dump and restore re-probes, running
# `iptables -L` and `ip6tables -L` (~25 ms). Warren keeps the directory root-only (checkpoint::criu).
rundir=/dev/shm/warren-criu
build_id="$version rundir=$rundir $(cat "${patches[@]}" | sha256sum | cut -d' ' -f1)"

if [ -x "$dest" ] && "$dest" --version 2>/dev/null | grep -q "Version: $version\$" \
    && [ "$(cat "$stamp" 2>/dev/null)" = "$build_id" ]; then
    exit 0
fi

deps=(libprotobuf-c-dev protobuf-c-compiler libprotobuf-dev protobuf-compiler libnl-3-dev libnet1-dev
      libcap-dev libbsd-dev libnftables-dev libgnutls28-dev uuid-dev pkgconf python3-protobuf
      build-essential patch)
missing=()
for p in "${deps[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
    apt-get -o DPkg::Lock::Timeout=900 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -qq --no-install-recommends "${missing[@]}"
fi

# The Debian mirror the system already uses (deb822 or one-line format), deb.debian.org otherwise.
mirror=$(sed -n -e 's/^URIs:[[:space:]]*\([^[:space:]]*\/debian\)\/\?[[:space:]]*$/\1/p' \
        /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1 || true)
if [ -z "$mirror" ]; then
    mirror=$(sed -n -e 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]*\/debian\)\/\?[[:space:]].*/\2/p' \
            /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | head -n1 || true)
fi
mirror=${mirror:-http://deb.debian.org/debian}

mkdir -p "$cache/apt/lists/partial" "$cache/apt/cache" "$cache/src"
echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main" \
    > "$cache/apt/sources.list"
apt_opts=(-o "Dir::Etc::SourceList=$cache/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
          -o "Dir::State::Lists=$cache/apt/lists" -o "Dir::Cache=$cache/apt/cache")

cd "$cache/src"
if [ ! -f "$tarball" ] || ! echo "$tarball_sha256  $tarball" | sha256sum -c --quiet - >/dev/null 2>&1; then
    rm -f "$tarball"
    apt-get "${apt_opts[@]}" -qq update
    # The .dsc and debian.tar.xz of this version answer 404 on the mirror; the upstream tarball does not,
    # and it is all we need (we build upstream's `criu` target, not the Debian package).
    apt-get "${apt_opts[@]}" source --download-only "criu=${version}-1" || true
    echo "$tarball_sha256  $tarball" | sha256sum -c --quiet -
fi

rm -rf "criu-$version"
tar -xf "$tarball"
cd "criu-$version"
for p in "${patches[@]}"; do patch -p1 --quiet < "$p"; done
# Only the binary: the docs need asciidoc/xmlto, the libraries and python bindings are not used.
make -j"$(nproc)" RUNDIR="$rundir" criu >"$cache/build.log" 2>&1 || { tail -n 40 "$cache/build.log"; exit 1; }
install -D -m 0755 criu/criu "$dest.new"
mv -f "$dest.new" "$dest"
mkdir -p "$(dirname "$stamp")" && echo "$build_id" > "$stamp"
cd "$cache/src" && rm -rf "criu-$version"
"$dest" --version
