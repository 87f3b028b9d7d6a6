# SPDX-License-Identifier: Apache-2.0
# Sourced by tests/slurm/cluster.sh and tests/k8s/cluster.sh (bash): free TCP
# ports for a test cluster's daemons.

# used_ports: every local TCP port in use, in any state (from /proc, so
# neither ss nor netstat is needed): an outgoing connection's local port
# blocks bind() as much as a listener does.
used_ports() {
  local f h
  for f in /proc/net/tcp /proc/net/tcp6; do
    [[ -r $f ]] || continue
    awk 'NR > 1 { split($2, a, ":"); print a[2] }' "$f" |
      while read -r h; do echo $((16#$h)); done
  done
}

# pick_ports N: N adjacent free TCP ports, random, from 10000 up to Linux's
# ephemeral range (ip_local_port_range, 32768..60999 by default; 32000 at
# most), so no outgoing connection takes one between this pick and bind().
# Status 1 when 200 tries found none.
pick_ports() {
  local n=$1 used base lo=10000 hi=32000 range i ok out
  read -r range _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null && ((range > lo + 2000 && range < hi)) && hi=$range
  used=" $(used_ports | sort -u | tr '\n' ' ') "
  for _ in $(seq 1 200); do
    base=$((lo + (RANDOM * 32768 + RANDOM) % (hi - lo - n)))
    ok=1 out=""
    for ((i = 0; i < n; i++)); do
      [[ $used == *" $((base + i)) "* ]] && { ok=0; break; }
      out+="${out:+ }$((base + i))"
    done
    ((ok)) && { echo "$out"; return 0; }
  done
  return 1
}
