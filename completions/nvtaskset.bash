# SPDX-License-Identifier: Apache-2.0
# bash completion for nvtaskset(1). Installed by `cmake --install` into
# share/bash-completion/completions/nvtaskset.

# PIDs of the caller's processes that run under nvtaskset: those holding a
# control region (/proc/<pid>/fd/N -> /memfd:nvtaskset.<pid>). Other users'
# descriptors are not readable, which matches who may change them.
_nvtaskset_pids() {
    local fd pid
    for fd in /proc/[0-9]*/fd/*; do
        case $(readlink "$fd" 2>/dev/null) in
            /memfd:nvtaskset.*) pid=${fd#/proc/}; echo "${pid%%/*}" ;;
        esac
    done 2>/dev/null | sort -un
}

# GPU indices and UUIDs, from nvidia-smi when it is there (never from
# nvtaskset itself, which could calibrate).
_nvtaskset_devices() {
    command -v nvidia-smi >/dev/null 2>&1 || return
    nvidia-smi --query-gpu=index,uuid --format=csv,noheader 2>/dev/null | tr -d ' ' | tr ',' '\n'
}

_nvtaskset() {
    local cur prev
    cur=${COMP_WORDS[COMP_CWORD]}
    prev=${COMP_WORDS[COMP_CWORD-1]}
    local opts="-t --tpc-list -g --gpc-list -n --count --spread --exclusive --latency-critical --best-effort --partition-sm-count --hide-unallocated -p --pid -a --all-tasks -d --device
                --physical --no-mps --mps-multi-user --env-for --topology --json --calibrate --topology-file --system-wide --status --verify
                --seed --show -v --verbose -h --help -V --version"
    case $prev in
        -d|--device) COMPREPLY=($(compgen -W "$(_nvtaskset_devices)" -- "$cur")); return ;;
        --topology-file) COMPREPLY=($(compgen -f -- "$cur")); return ;;
        --system-wide) COMPREPLY=($(compgen -W "enable disable status" -- "$cur")); return ;;
        --show) COMPREPLY=($(compgen -W "list mask gpcs physical" -- "$cur")); return ;;
        --env-for) COMPREPLY=($(compgen -W "$(ps -eo pid= 2>/dev/null)" -- "$cur")); return ;;
        -t|--tpc-list|-g|--gpc-list|-n|--count|--physical|--seed) return ;;
    esac
    local w pid_mode=0 i
    for ((i = 1; i < COMP_CWORD; i++)); do
        w=${COMP_WORDS[i]}
        case $w in -p|--pid) pid_mode=1 ;; esac
    done
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$opts" -- "$cur"))
    elif ((pid_mode)); then
        COMPREPLY=($(compgen -W "$(_nvtaskset_pids)" -- "$cur"))
    else
        # The command to run and its arguments.
        COMPREPLY=($(compgen -c -- "$cur"))
    fi
}
complete -F _nvtaskset -o default nvtaskset
