#!/usr/bin/env bash
# Disk quota per sandbox (issue 15): a size-limited tmpfs against a
# loop-mounted ext4 image, measured on this node. Root only. Prints, for
# each: setup and teardown time (mean of N), write throughput of 512 MiB,
# what the node's disk and memory pay for a full quota and which cgroup the
# memory is charged to; and the cost of a release (copying a session's
# files from the tmpfs to disk). Cleans up after itself.
#
#   sudo bash tests/benches/disk_quota.sh [STATE_DIR_PARENT]
set -euo pipefail
base=${1:-/var/tmp}
N=${N:-20}
work=$(mktemp -d "$base/polar-quota-bench.XXXXXX")
# The writer's memory cgroup: cgroup v2 where it has the memory
# controller, else the v1 memory hierarchy.
if grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
    cg=/sys/fs/cgroup/polar-quota-bench-$$ usage=memory.current limit=memory.max
elif [ -d /sys/fs/cgroup/memory ]; then
    cg=/sys/fs/cgroup/memory/polar-quota-bench-$$ usage=memory.usage_in_bytes limit=memory.limit_in_bytes
else
    echo "no memory cgroup controller found" >&2; exit 1
fi
cleanup() {
    set +e
    for m in "$work"/t "$work"/l; do mountpoint -q "$m" && umount -l "$m"; done
    [ -d "$cg" ] && { cat "$cg/cgroup.procs" 2>/dev/null | xargs -r kill -9; rmdir "$cg"; }
    rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/t" "$work/l"
now() { date +%s%N; }
ms() { awk -v a="$1" -v b="$2" -v n="$3" 'BEGIN { printf "%.2f", (b - a) / n / 1e6 }'; }

size=$((2 << 30))
echo "== tmpfs (size=2 GiB, nr_inodes=262144)"
t0=$(now)
for _ in $(seq "$N"); do
    mount -t tmpfs -o size=$size,nr_inodes=262144,mode=0711,nosuid,nodev polar-bench "$work/t"
    umount "$work/t"
done
t1=$(now)
echo "mount+umount: $(ms "$t0" "$t1" "$N") ms each (mean of $N)"

echo "== loop image (sparse 2 GiB file, mkfs.ext4, mount -o loop)"
t0=$(now)
for _ in $(seq "$N"); do
    truncate -s $size "$work/img"
    mkfs.ext4 -q -F -E lazy_itable_init=1,lazy_journal_init=1 "$work/img"
    mount -o loop,nosuid,nodev "$work/img" "$work/l"
    umount "$work/l"
    rm -f "$work/img"
done
t1=$(now)
echo "truncate+mkfs+mount+umount+rm: $(ms "$t0" "$t1" "$N") ms each (mean of $N)"
truncate -s $size "$work/img"
t0=$(now); mkfs.ext4 -q -F -E lazy_itable_init=1,lazy_journal_init=1 "$work/img"; t1=$(now)
echo "  of which mkfs.ext4: $(ms "$t0" "$t1" 1) ms"
echo "  image on disk right after mkfs: $(du -k "$work/img" | cut -f1) KiB"

# Writes from a process in a cgroup of its own, to see who is charged.
mkdir "$cg"
write_in_cg() { # target file, MiB, extra dd flags
    sh -c 'echo $$ > '"$cg"'/cgroup.procs; exec dd if=/dev/zero of="$1" bs=1M count="$2" $3 2>&1' _ "$@" | tail -1
}
mount -t tmpfs -o size=$size,nr_inodes=262144,mode=0711,nosuid,nodev polar-bench "$work/t"
shmem0=$(awk '/^Shmem:/ {print $2}' /proc/meminfo)
echo "== write 512 MiB into the tmpfs:"
write_in_cg "$work/t/fill" 512 ""
echo "  writer's cgroup $usage: $(( $(cat "$cg/$usage") / 1048576 )) MiB, shmem charged to it: $(( $(awk '/^shmem / {print $2; exit}' "$cg/memory.stat") / 1048576 )) MiB"
echo "  node Shmem grew by $(( ($(awk '/^Shmem:/ {print $2}' /proc/meminfo) - shmem0) / 1024 )) MiB; node disk: 0"
echo "  with a 256 MiB memory limit, a writer of 512 MiB into a fresh tmpfs:"
rm -f "$work/t/fill"
echo $((256 << 20)) > "$cg/$limit"
write_in_cg "$work/t/fill" 512 "" || true
echo "  file size reached: $(( $(stat -c %s "$work/t/fill") / 1048576 )) MiB"
echo -1 > "$cg/$limit" 2>/dev/null || echo max > "$cg/$limit"
rm -f "$work/t/fill"
echo "== a release: 1000 files, 100 MiB, tmpfs -> disk (cp -a, as the release copies)"
mkdir "$work/t/ws"
for i in $(seq 1000); do head -c 104857 /dev/urandom > "$work/t/ws/f$i"; done
t0=$(now); cp -a "$work/t/ws" "$work/persist"; sync -f "$work/persist"; t1=$(now)
echo "  copy + sync: $(ms "$t0" "$t1" 1) ms"
rm -rf "$work/persist"
umount "$work/t"

mount -o loop,nosuid,nodev "$work/img" "$work/l"
echo "== write 512 MiB into the loop image (conv=fsync):"
write_in_cg "$work/l/fill" 512 "conv=fsync"
echo "  image on disk after: $(( $(du -k "$work/img" | cut -f1) / 1024 )) MiB (the node's disk pays)"
echo "  writer's cgroup $usage after: $(( $(cat "$cg/$usage") / 1048576 )) MiB (page cache, reclaimable)"
umount "$work/l"
