#!/usr/bin/env bash
# needs: 10-apt
# Builds the Debian 12 minimal base rootfs every sandbox template starts from, once, into
# $WARREN_CACHE/rootfs/debian12-base. The build goes into a temp dir next to it and is renamed into place
# only when complete (a `.warren-complete` stamp inside marks a finished build), so an interrupted run
# never leaves a half rootfs that later runs would trust.
set -euo pipefail
cache=${WARREN_CACHE:-/var/cache/warren}
dest="$cache/rootfs/debian12-base"
stamp=".warren-complete"
mirror=${WARREN_DEBIAN_MIRROR:-http://deb.debian.org/debian}

# Adjustments made to a finished rootfs, idempotent, so they also reach a rootfs cached by an older
# setup. Every command the SDK runs is `bash -l -c ...`, whose /etc/profile forks id(1) just to learn the
# user ID; bash already knows it as $EUID, so only other shells still fork (saves one process start,
# ~2 ms here, per command).
# E2B's base template has `python` on PATH (code runs `python script.py`); fresh builds get it from
# python-is-python3, and an older cached rootfs gets the same link here.
# A terminal's tools (the dashboard's terminal and `warren sandbox shell`): vim-tiny, as `vi` and `vim`,
# and htop. Fresh builds get them from mmdebstrap; a rootfs cached by an older setup gets them here,
# the same Debian 12 packages installed with its own dpkg (only files are added, nothing replaced).
tune() {
    sed -i 's/"\$(id -u)"/"${EUID:-$(id -u)}"/g' "$1/etc/profile"
    if [ ! -e "$1/usr/bin/python" ] && [ ! -L "$1/usr/bin/python" ]; then
        ln -s python3 "$1/usr/bin/python"
    fi
    if [ ! -x "$1/usr/bin/vim.tiny" ] || [ ! -x "$1/usr/bin/htop" ]; then
        local debs
        debs=$(mktemp -d "$1/tmp/.warren-debs.XXXXXX")
        get() { (cd "$debs" && apt-get download -qq -o APT::Sandbox::User=root vim-tiny vim-common htop libnl-3-200 libnl-genl-3-200); }
        get || { apt-get update -qq && get; }
        chroot "$1" sh -c "dpkg -i /tmp/$(basename "$debs")/*.deb >/dev/null"
        rm -rf "$debs"
    fi
    if [ ! -e "$1/usr/bin/vim" ]; then
        chroot "$1" update-alternatives --quiet --install /usr/bin/vim vim /usr/bin/vim.tiny 10
    fi
}

# E2B's base image has pip and venv, and `fromTemplate("base")` builds expect them: fresh builds include
# them, so that base step needs no network. A rootfs cached by an older setup is left without them (adding
# them would upgrade its python3.11 to the mirror's revision, and every running-state template's
# checkpoint maps that binary): its `fromTemplate("base")` builds install them over apt, as before.
if [ -f "$dest/$stamp" ]; then
    tune "$dest"
    echo "base rootfs present: $dest"
    exit 0
fi
if ! command -v mmdebstrap >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap
fi

mkdir -p "$cache/rootfs"
tmp=$(mktemp -d "$cache/rootfs/.debian12-base.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

packages=python3,python-is-python3,python3-pip,python3-venv,bash,coreutils,procps,iproute2,curl,git,ca-certificates,sudo,vim-tiny,htop
# --variant=minbase: essential + apt only; the packages above on top. --mode=root: we run as root, no
# user namespace needed. The customize hooks create the sandbox user and its sudo rule inside the chroot.
mmdebstrap --variant=minbase --mode=root --include="$packages" \
    --customize-hook='chroot "$1" groupadd --gid 1000 user' \
    --customize-hook='chroot "$1" useradd --uid 1000 --gid 1000 --create-home --home-dir /home/user --shell /bin/bash user' \
    --customize-hook='echo "user ALL=(ALL:ALL) NOPASSWD: ALL" > "$1/etc/sudoers.d/user" && chmod 0440 "$1/etc/sudoers.d/user"' \
    --customize-hook='rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/*' \
    --customize-hook=': > "$1/etc/machine-id"' \
    bookworm "$tmp/root" "$mirror"

tune "$tmp/root"
touch "$tmp/root/$stamp"
# An incomplete earlier attempt (no stamp) is replaced; rename is atomic within one filesystem.
if [ -e "$dest" ]; then rm -rf "$dest"; fi
mv "$tmp/root" "$dest"
echo "base rootfs built: $dest"
