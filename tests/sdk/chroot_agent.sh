#!/bin/bash
# Test helper: runs inside `unshare --mount --pid --fork`. Overlays the base rootfs (never written),
# gives it /proc and a devpts as the runtime does, bind-mounts the agent read-only at /.warren/agent
# and execs it as PID 1, chrooted, on 127.0.0.1:PORT. All mounts die with the namespace.
set -euo pipefail
agent=$1 port=$2 work=$3 rootfs=$4
mkdir -p "$work/upper" "$work/work" "$work/merged"
mount -t overlay overlay -o "lowerdir=$rootfs,upperdir=$work/upper,workdir=$work/work" "$work/merged"
mkdir -p "$work/merged/.warren" "$work/merged/dev/pts"
touch "$work/merged/.warren/agent"
mount --bind -o ro "$agent" "$work/merged/.warren/agent"
mount -t proc proc "$work/merged/proc"
mount -t devpts devpts -o newinstance,ptmxmode=0666,mode=0620 "$work/merged/dev/pts"
touch "$work/merged/dev/ptmx"
mount --bind "$work/merged/dev/pts/ptmx" "$work/merged/dev/ptmx"
exec chroot "$work/merged" /.warren/agent --listen "127.0.0.1:$port"
