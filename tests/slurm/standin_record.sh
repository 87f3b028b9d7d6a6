# SPDX-License-Identifier: Apache-2.0
# Sourced (bash) by test_spank.sh and by tests/gpu/slurm_check.sh's dry run.
# standin_tpcs RECORD PID NTPCS: the TPCs the stand-in driver recorded for
# PID's last kernel (tests/fakecuda: "<pid> <layout> <valid> <disable mask>
# <source>" a line), as a comma-separated list of indices: the zeros of the
# disable mask below NTPCS (identity layout, TPC k is bit k). Status 1 when
# PID launched nothing.
standin_tpcs() {
  local mask hex i d bit out=""
  mask=$(awk -v p="$2" '$1 == p {m = $4} END {print m}' "$1")
  [[ -n $mask ]] || return 1
  hex=${mask#0x}
  for ((i = 0; i < $3; i++)); do
    d=$((i / 4))
    if ((d < ${#hex})); then bit=$(((16#${hex:${#hex}-1-d:1} >> (i % 4)) & 1)); else bit=0; fi
    ((bit)) || out+=${out:+,}$i
  done
  echo "$out"
}
