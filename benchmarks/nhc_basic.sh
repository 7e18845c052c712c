#!/bin/bash
# The reference for benchmarks/passive_profile.py: LBNL NHC's basic checks as one bash script, the way NHC reads
# (https://github.com/mej/nhc, scripts/lbnl_hw.nhc: nhc_hw_cpu_gather_data and nhc_hw_mem_gather_data read
# /proc/cpuinfo and /proc/meminfo with `while read -a`; scripts/lbnl_fs.nhc: check_fs_mount reads /proc/mounts,
# check_fs_free runs `df`; scripts/lbnl_ps.nhc: the process table from `ps`). NHC itself adds the parsing of its
# own ~4,900 lines of bash on every run; this script is the work alone. Prints one line and exits 0 when the node
# passes, 1 with the reason when not, as a HealthCheckProgram does.
set -f

fail() {
    echo "nhc-basic: $*"
    exit 1
}

# Memory: MemTotal, and free as NHC counts it (MemFree + Buffers + Cached).
ram_total=0 ram_free=0
while read -a field; do
    case "${field[0]}" in
        MemTotal:) ram_total=${field[1]} ;;
        MemFree: | Buffers: | Cached:) ((ram_free += field[1])) ;;
    esac
done </proc/meminfo
((ram_total > 0)) || fail "no MemTotal in /proc/meminfo"

# CPUs: processors, sockets (distinct physical ids), cores per socket.
processors=0 sockets=0 cores=0
declare -A phys
while read -a field; do
    if [[ "${field[0]} ${field[1]}" == "processor :" ]]; then
        ((processors++))
    elif [[ "${field[0]} ${field[1]} ${field[2]}" == "physical id :" ]]; then
        [[ -n "${phys[${field[3]}]}" ]] || { phys[${field[3]}]=1; ((sockets++)); }
    elif [[ "${field[0]} ${field[1]} ${field[2]}" == "cpu cores :" ]]; then
        cores=${field[3]}
    fi
done </proc/cpuinfo
((processors > 0)) || fail "no processor in /proc/cpuinfo"

# Mounts: / and /tmp mounted, / read-write.
root_opts="" tmp_seen=0
while read -r dev mnt fstype opts rest; do
    [[ "$mnt" == "/" ]] && root_opts=$opts
    [[ "$mnt" == "/tmp" || "$mnt" == "/" ]] && tmp_seen=1
done </proc/mounts
[[ -n "$root_opts" ]] || fail "/ not mounted"
[[ ",$root_opts," == *,rw,* ]] || fail "/ mounted read-only"
((tmp_seen)) || fail "/tmp not mounted"

# Free space: at least 1% of / and /tmp free (df -kP: POSIX output, 1 KiB blocks).
while read -r fs blocks used avail pct mnt; do
    [[ "$fs" == "Filesystem" ]] && continue
    ((blocks > 0 && avail * 100 / blocks >= 1)) || fail "$mnt: less than 1% free"
done < <(df -kP / /tmp)

# Process table: every process with its owner, and none in the uninterruptible D state for the check to flag.
procs=0 dstate=0
while read -r user pid stat rest; do
    [[ "$pid" == "PID" ]] && continue
    ((procs++))
    [[ "$stat" == D* ]] && ((dstate++))
done < <(ps -eo user,pid,stat,args)
((procs > 0)) || fail "empty process table"

echo "nhc-basic: ok: ${processors} CPUs (${sockets} sockets, ${cores} cores each), ${ram_total} kB RAM" \
    "(${ram_free} kB free), ${procs} processes (${dstate} in D state)"
