#!/bin/sh
# Read-only probe of the host for the gpunode_tuning role; prints one JSON object.
# Arguments: sysctl names to report (current value, writable or not).
LC_ALL=C
export LC_ALL

# A JSON string of $1, every character kept: backslash, quote, tab, CR and newline escaped; other control
# characters (invalid raw in JSON, never in the values read here) are dropped.
json_str() {
  printf '"'
  printf '%s' "$1" | tr -d '\001-\010\013\014\016-\037' |
    sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e "s/$(printf '\t')/\\\\t/g" -e "s/$(printf '\r')/\\\\r/g" |
    awk 'NR > 1 { printf "\\n" } { printf "%s", $0 }'
  printf '"'
}

cores=$(awk -F: '/^physical id/{p=$2} /^core id/{print p ":" $2}' /proc/cpuinfo | sort -u | wc -l)
cpus=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
[ "$cores" -gt 0 ] || cores=$cpus
avx2=false
grep -qw avx2 /proc/cpuinfo && avx2=true
memtotal_kb=$(awk '/^MemTotal:/{print $2}' /proc/meminfo)
numa_nodes=0
for d in /sys/devices/system/node/node[0-9]*; do
  [ -d "$d" ] && numa_nodes=$((numa_nodes + 1))
done

# NVIDIA GPUs (vendor 0x10de, class VGA 0x0300xx or 3D 0x0302xx) in PCI bus order, with their NUMA node.
gpus=""
for dev in /sys/bus/pci/devices/*; do
  [ -r "$dev/vendor" ] || continue
  [ "$(cat "$dev/vendor")" = 0x10de ] || continue
  case "$(cat "$dev/class")" in 0x0300*|0x0302*) ;; *) continue ;; esac
  node=$(cat "$dev/numa_node" 2>/dev/null || echo -1)
  gpus="$gpus${gpus:+,}$(json_str "${dev##*/}"):$node"
done

shm_bytes=$(stat -f -c '%S %b' /dev/shm 2>/dev/null | awk '{print $1 * $2}')

gov_present=false; gov_writable=false; gov_current=""; gov_available=""; first=""
for f in /sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor; do
  [ -e "$f" ] || continue
  [ -n "$first" ] || first=$f
  gov_current="$gov_current$(cat "$f" 2>/dev/null)
"
done
if [ -n "$first" ]; then
  gov_present=true
  [ -w "$first" ] && gov_writable=true
  gov_current=$(printf '%s' "$gov_current" | sort -u | tr '\n' ' ')
  gov_available=$(cat "${first%/*}/scaling_available_governors" 2>/dev/null)
fi

thp_file=/sys/kernel/mm/transparent_hugepage/enabled
thp_present=false; thp_writable=false; thp_current=""
if [ -r "$thp_file" ]; then
  thp_present=true
  [ -w "$thp_file" ] && thp_writable=true
  thp_current=$(sed -n 's/.*\[\(.*\)\].*/\1/p' "$thp_file")
fi

sysctls=""
for name in "$@"; do
  path=/proc/sys/$(echo "$name" | tr . /)
  if [ -e "$path" ]; then
    present=true; value=$(cat "$path" 2>/dev/null); writable=false
    [ -w "$path" ] && writable=true
  else
    present=false; value=""; writable=false
  fi
  sysctls="$sysctls${sysctls:+,}$(json_str "$name"):{\"present\":$present,\"writable\":$writable,\"value\":$(json_str "$value")}"
done

# CAP_SYS_ADMIN (bit 21 of the effective set, capabilities(7)): a container without it cannot remount /dev/shm.
cap_sys_admin=false
capeff=$(awk '/^CapEff:/ {print $2}' /proc/self/status 2>/dev/null)
if [ -n "$capeff" ] && [ $(( (0x$capeff >> 21) & 1 )) -eq 1 ]; then cap_sys_admin=true; fi

pid1_limit() { awk -v k="$1" 'index($0, k) == 1 {print $(NF-1)}' /proc/1/limits 2>/dev/null; }

printf '{"physical_cores":%s,"cpus":%s,"avx2":%s,"memtotal_kb":%s,"numa_nodes":%s,"gpus":{%s},' \
  "$cores" "$cpus" "$avx2" "${memtotal_kb:-0}" "$numa_nodes" "$gpus"
printf '"shm_bytes":%s,"governor":{"present":%s,"writable":%s,"current":%s,"available":%s},' \
  "${shm_bytes:-0}" "$gov_present" "$gov_writable" "$(json_str "$gov_current")" "$(json_str "$gov_available")"
printf '"thp":{"present":%s,"writable":%s,"current":%s},"sysctl":{%s},' \
  "$thp_present" "$thp_writable" "$(json_str "$thp_current")" "$sysctls"
printf '"pid1_hard_memlock":%s,"pid1_hard_nofile":%s,"cap_sys_admin":%s}\n' \
  "$(json_str "$(pid1_limit 'Max locked memory')")" "$(json_str "$(pid1_limit 'Max open files')")" "$cap_sys_admin"
