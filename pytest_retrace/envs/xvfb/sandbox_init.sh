#!/bin/sh
# Runs as root inside the fresh namespaces, before anything of the task exists. Binds come before the
# hiding mounts, which may cover their sources. $1: the desktop's root, $2: display number, $3: "isolated"
# without network, $4: tini (or empty), $5: the script that starts the X server and window manager in here
# (or empty: they run outside, and the display's socket is bound in), $6: where their home is seen (WM_HOME),
# then the directories to hide.
# Its working directory and standard streams are opened here: ones from outside the mount namespace would
# tie the tree to the host's mounts, which a checkpoint cannot take.
set -eu
cd /
exec </dev/null
root=$1 display=$2 net=$3 tini=$4 desktop=$5 wm=$6
shift 6
if [ -n "$desktop" ]; then desktop=$(cat "$desktop"); fi  # read now: /tmp is about to be the task's
# the host's namespace files bound somewhere (docker's /run/docker/netns/*, `ip netns`'s): nothing a task needs,
# and CRIU cannot dump a mount namespace holding them ("doesn't have a proper root mount"); first, while every
# path still leads where the host's mount table says. Likewise the file systems of containers (docker's
# /var/lib/docker/overlay2/ID/merged, containerd's): one that ends between a dump and its restore leaves CRIU a
# mount it cannot make again ("Can't stat mountpoint").
if [ -n "$desktop" ]; then
  findmnt -rn -t nsfs -o TARGET | while read -r mnt; do umount -l "$mnt" 2>/dev/null || true; done
  findmnt -rn -o TARGET | grep -E '^/(var/lib|run)/(docker|containerd)(/|$)' | sort -r |
    while read -r mnt; do umount -l "$mnt" 2>/dev/null || true; done
fi
mount --bind "$root/etc/passwd" /etc/passwd
mount --bind "$root/etc/group" /etc/group
if [ -z "$desktop" ]; then mount --bind "/tmp/.X11-unix/X$display" "$root/tmp/.X11-unix/X$display"; fi
# the desktop's own programs (google-chrome) laid over the machine's /usr/local/bin, read-only; lowerdir is
# relative to $root, so no character of the desktop's path can be read as one of overlayfs's separators. A
# checkpointable desktop's is absolute (CRIU mounts it again with the same options, from elsewhere); start()
# made sure that path has no separator in it.
lower=programs
if [ -n "$desktop" ]; then lower=$root/programs; fi
if [ -d /usr/local/bin ]; then
  (cd "$root" && mount -t overlay -o "lowerdir=$lower:/usr/local/bin" retrace-programs /usr/local/bin) ||
    echo "retrace-sandbox: no overlay file system: the desktop's own programs are missing" >&2
fi
mount -t tmpfs -o mode=755,size=1m retrace-home /home
mkdir /home/user
mount --bind "$root/home" /home/user
if [ -n "$desktop" ]; then mkdir -m 700 "$wm" && mount --bind "$root/wm-home" "$wm"; fi
mount --rbind "$root/tmp" /tmp
mount -t tmpfs -o mode=1777,size=256m,nosuid,nodev retrace-scratch /var/tmp
mount -t tmpfs -o mode=1777,size=256m,nosuid,nodev retrace-scratch /dev/shm
if [ -d /run/lock ]; then mount -t tmpfs -o mode=1777,size=1m,nosuid,nodev retrace-scratch /run/lock; fi
# a mqueue file system shows the queues of the IPC namespace that mounted it: the task's, not the host's
if [ -d /dev/mqueue ]; then mount -t mqueue -o nosuid,nodev,noexec retrace-mqueue /dev/mqueue; fi
if [ "$net" = isolated ]; then ip link set lo up 2>/dev/null || true; fi
if [ -n "$desktop" ]; then /bin/sh -c "$desktop" retrace-desktop "$display"; fi
for dir in "$@"; do
  if [ -d "$dir" ]; then mount -t tmpfs -o ro,mode=755,size=4k retrace-hidden "$dir"; fi
done
echo ready
exec >/dev/null
if [ -n "$desktop" ]; then exec 2>/dev/null; fi
if [ -n "$tini" ]; then exec "$tini" -- sleep infinity; fi
exec sleep infinity
