# SPDX-License-Identifier: Apache-2.0
# Sourced (bash) by cluster.sh and test_spank.sh.
# conf_value VALUE: VALUE written as slurm.conf (or cgroup.conf) reads it
# back, on stdout; status 1 when it cannot be written there. Slurm's parser
# (src/common/parse_config.c) strips each line from its first unescaped "#",
# then drops every backslash but keeps the character after it ("\\" is one
# backslash, "\#" a "#"), then takes a value either in double quotes (which
# may hold whitespace, never a '"') or up to the first whitespace. So a path
# with a space is written quoted: TaskProlog="/a b/task_prolog.sh".
# (gres.conf's File= and plugstack.conf split on whitespace whatever the
# quotes: a path there must have none, see cluster.sh and test_spank.sh.)
conf_value() {
  local v=$1
  [[ $v != *$'\n'* ]] || return 1
  v=${v//\\/\\\\}
  v=${v//#/\\#}
  if [[ $v =~ [[:space:]] ]]; then
    [[ $v != *\"* ]] || return 1
    printf '"%s"\n' "$v"
  else
    [[ $v != \"* ]] || return 1
    printf '%s\n' "$v"
  fi
}
