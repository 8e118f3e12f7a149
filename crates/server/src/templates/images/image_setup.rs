//! What Warren adds to any pulled image so the E2B SDK works in its sandboxes. The agent is static and
//! needs nothing from the image; the SDK does: it runs `commands.run` as `/bin/bash -l -c CMD` as the
//! user `user` in `/home/user`. The image's own `base` step (root, `/`, the image's ENV) runs
//! [`SETUP_SCRIPT`] with the image's `/bin/sh`, using shell built-ins plus `mkdir`, `chown` and `chmod`
//! (busybox has them all):
//!
//! - the account `user` (uid 1000, or the next free uid when 1000 is taken; group `user` likewise)
//!   in `/etc/passwd`, `/etc/group` (and a locked `/etc/shadow` entry when that file exists), unless
//!   the image already has a `user`;
//! - `/home/user` owned by it, unless it exists;
//! - `/bin/bash` as a two-line script that execs `/bin/sh` with its arguments when the image has no bash
//!   (a symlink would not do: busybox picks its applet by the name it is called with). Busybox `ash`
//!   runs the SDK's `bash -l -c CMD`; bash-only syntax in commands then fails as it would under `sh`;
//! - a passwordless sudo rule in `/etc/sudoers.d/warren-user` when the image has sudo's directory.
//!
//! An image without `/bin/sh` (distroless, scratch) fails this step with the shell's exec error.

/// Run as root in `/` by `/bin/sh -c`.
pub const SETUP_SCRIPT: &str = r#"set -e
mkdir -p /etc
[ -e /etc/passwd ] || printf 'root:x:0:0:root:/root:/bin/sh\n' > /etc/passwd
[ -e /etc/group ] || printf 'root:x:0:\n' > /etc/group
has_user=''; used=' '
while IFS=: read -r name _ uid _ || [ -n "$name" ]; do
  [ "$name" = user ] && has_user=1
  used="$used$uid "
done < /etc/passwd
if [ -z "$has_user" ]; then
  uid=1000
  while case "$used" in *" $uid "*) true;; *) false;; esac; do uid=$((uid + 1)); done
  gid=''; gused=' '
  while IFS=: read -r gname _ g _ || [ -n "$gname" ]; do
    [ "$gname" = user ] && gid="$g"
    gused="$gused$g "
  done < /etc/group
  if [ -z "$gid" ]; then
    gid="$uid"
    while case "$gused" in *" $gid "*) true;; *) false;; esac; do gid=$((gid + 1)); done
    printf 'user:x:%s:\n' "$gid" >> /etc/group
  fi
  shell=/bin/sh
  [ -x /bin/bash ] && shell=/bin/bash
  printf 'user:x:%s:%s::/home/user:%s\n' "$uid" "$gid" "$shell" >> /etc/passwd
  if [ -f /etc/shadow ]; then printf 'user:!:19000:0:99999:7:::\n' >> /etc/shadow; fi
  echo "warren: created user user ($uid:$gid)"
fi
while IFS=: read -r name _ uid gid _ || [ -n "$name" ]; do
  if [ "$name" = user ]; then user_uid="$uid"; user_gid="$gid"; fi
done < /etc/passwd
if [ ! -e /home/user ]; then
  mkdir -p /home/user
  chown "$user_uid:$user_gid" /home/user
  chmod 755 /home/user
fi
if [ ! -e /bin/bash ]; then
  printf '#!/bin/sh\n# Warren: this image has no bash; the E2B SDK runs commands with /bin/bash -l -c.\nexec /bin/sh "$@"\n' > /bin/bash
  chmod 755 /bin/bash
  echo "warren: no bash in the image: /bin/bash runs /bin/sh"
fi
if [ -d /etc/sudoers.d ]; then
  printf 'user ALL=(ALL:ALL) NOPASSWD: ALL\n' > /etc/sudoers.d/warren-user
  chmod 440 /etc/sudoers.d/warren-user
fi
"#;
