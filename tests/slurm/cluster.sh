#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# A one-node Slurm cluster (munged + slurmctld + slurmd) for tests, with all
# of its state in one private directory DIR. Nothing in /etc, /var or /run is
# read or written: it runs beside a system munge/slurm and beside other
# instances of itself (each picks its own TCP ports).
#
#   cluster.sh start DIR [options]   generate config in DIR, start the daemons,
#                                    wait until the node is idle
#   cluster.sh stop DIR              cancel jobs, stop the daemons by PID,
#                                    check that none survives
#   cluster.sh env DIR               print the shell lines a test evals:
#                                    eval "$(cluster.sh env DIR)"
#   cluster.sh status DIR            which recorded daemons are alive, sinfo
#   cluster.sh logs DIR [N]          the last N (30) lines of every log
#   cluster.sh bundle OUT            apt-get download Slurm 22.05 + munge and the
#                                    libraries they need, unpacked into OUT/root:
#                                    a portable copy for --prefix (Debian 12 host)
#
# start options:
#   --shards N        shard count of each stand-in GPU (8)
#   --gpus N          stand-in GPUs (1): DIR/dev/nvidia0 .. nvidia(N-1)
#   --cpus N          CPUs the node advertises (8; SlurmdParameters=config_overrides,
#                     so it need not match the machine)
#   --node NAME       node name (hostname -s)
#   --timeout S       seconds to wait for the idle node (30)
#   --debug LEVEL     SlurmctldDebug/SlurmdDebug (info); e.g. debug2
#   --owner PID       stop the cluster when process PID ends (a watchdog, so a
#                     crashed test driver leaves no daemon behind)
#   --max-seconds S   with or without --owner, stop the cluster after S seconds
#                     (3600); 0 disables
#   --no-mknod        make the stand-in GPU a regular file, not a device node
#                     (where CAP_MKNOD is missing; steps then get no
#                     CUDA_VISIBLE_DEVICES, SLURM_STEP_GPUS, GPU_DEVICE_ORDINAL)
#   --gpu-file PATH   gres.conf's File= is PATH (a real GPU: /dev/nvidia0), no
#                     stand-in device node
#   --prefix P        run munged, slurmctld, slurmd (and slurmstepd) and the
#                     clients from an unpacked bundle (`bundle OUT` makes one;
#                     P is OUT or OUT/root) instead of the system's: the
#                     daemons get LD_LIBRARY_PATH of the bundle, slurm.conf its
#                     PluginDir, and DIR/bin wrappers run the clients (srun,
#                     sinfo, ...) through the system's dynamic loader with
#                     --library-path, so no LD_LIBRARY_PATH reaches a job's
#                     environment. `env` puts DIR/bin first in PATH. Also
#                     NVTS_SLURM_PREFIX in the environment.
#
# DIR must be empty or absent; its path at most 60 bytes (the slurmd spool
# holds Unix sockets, whose paths must fit in 108 bytes), of letters, digits
# and ._/+@%- only (its paths go unquoted into gres.conf, whose File= is
# split at whitespace). Paths from elsewhere (--prefix, --gpu-file) may hold
# spaces: slurm.conf gets them quoted, gres.conf a link in DIR.
#
# Every daemon runs in the foreground (-D / -F), detached with setsid, stdio
# to DIR/log/*.out, its PID recorded in DIR/run/*.pid, and carries
# NVTS_SLURM_HARNESS=DIR in its environment (slurmstepd and slurmscriptd
# inherit it). `stop` signals only processes it has identified exactly:
#   1. scancel of every job (slurmstepd ends the tasks), bounded wait;
#   2. the jobs' processes still left: unmarked descendants of a marked
#      process, or a process whose initial environment holds
#      SLURM_CONF=DIR/slurm.conf and SLURM_JOB_ID (a task whose slurmstepd
#      died): TERM, 3 s, KILL;
#   3. slurmd, slurmctld, munged by their recorded PIDs: TERM, 10 s, KILL;
#   4. any marked process left (a slurmstepd, which ignores TERM): TERM, 2 s,
#      KILL.
# A PID is signalled only while it carries the marker (or was found by rule 2)
# and has the start time it had when found: a recycled PID is never hit.
# Never by name: no pkill, no killall.
set -uo pipefail

SELF=$(readlink -f "$0")
PROG=${0##*/}

die() { echo "$PROG: $*" >&2; exit 1; }

# ---------------------------------------------------------------- helpers ---

# now_ms: milliseconds since the epoch.
now_ms() { local t; t=$(date +%s%N); echo $((t / 1000000)); }

# has_marker PID DIR: PID is alive and carries NVTS_SLURM_HARNESS=DIR.
has_marker() {
  local pid=$1 dir=$2 e
  # A zombie's environ reads empty: it holds nothing and does not count.
  { while IFS= read -r -d '' e; do
      [[ $e == "NVTS_SLURM_HARNESS=$dir" ]] && return 0
    done <"/proc/$pid/environ"; } 2>/dev/null
  return 1
}

# marked_pids DIR: every live process carrying the marker of DIR.
marked_pids() {
  local dir=$1 p pid
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    [[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
    has_marker "$pid" "$dir" && echo "$pid"
  done
}

# used_ports, pick_ports N (tests/lib/ports.sh).
# shellcheck source=../lib/ports.sh
source "${SELF%/*}/../lib/ports.sh"
# conf_value VALUE (slurm_conf.sh): VALUE as slurm.conf reads it, quoted
# where it holds whitespace.
# shellcheck source=slurm_conf.sh
source "${SELF%/*}/slurm_conf.sh"

# plain_path PATH: PATH holds only characters that every Slurm config file
# and option list takes unquoted and unescaped: no whitespace (gres.conf's
# File= is a host list, split at whitespace and commas), no quote, "#",
# backslash, ":" or ",".
plain_path() { [[ $1 =~ ^[-A-Za-z0-9._/+@%]+$ ]]; }

pidfile_of() { echo "$1/run/$2.pid"; }

# alive NAME DIR: the recorded daemon NAME of DIR is still running.
alive() {
  local f pid
  f=$(pidfile_of "$2" "$1")
  [[ -s $f ]] || return 1
  pid=$(<"$f")
  has_marker "$pid" "$2"
}

tail_logs() {
  local dir=$1 n=${2:-30} f
  for f in "$dir"/munge/munged.log "$dir"/log/*.log "$dir"/log/*.out; do
    [[ -s $f ]] || continue
    echo "----- $f (last $n lines)"
    tail -n "$n" "$f"
  done
}

# daemon NAME DIR CMD...: start CMD detached (own session, stdio to a file),
# with the marker in its environment; record its PID.
daemon() {
  local name=$1 dir=$2
  shift 2
  NVTS_SLURM_HARNESS=$dir SLURM_CONF=$dir/slurm.conf \
    "${DAEMON_ENV[@]}" setsid "$@" </dev/null >>"$dir/log/$name.out" 2>&1 &
  local pid=$! deadline
  echo "$pid" >"$(pidfile_of "$dir" "$name")"
  # Until the fork execs, /proc/PID/environ is this shell's, without the
  # marker, and `alive` would call the daemon dead: on a loaded machine that
  # gap lasted long enough to fail a start. Wait for the exec (or the exit).
  deadline=$(($(now_ms) + 5000))
  until has_marker "$pid" "$dir"; do
    kill -0 "$pid" 2>/dev/null || return 0
    (($(now_ms) > deadline)) && return 0
    sleep 0.01
  done
}

# ----------------------------------------------------------------- bundle ---

# With --prefix: the bundle's root (the directory holding usr/), its library
# path, and what the daemons get in their environment (env(1) arguments).
PREFIX=""
LIBS=""
DAEMON_ENV=(env)
# The system's dynamic loader (PT_INTERP of every x86-64 glibc binary).
LOADER=/lib64/ld-linux-x86-64.so.2
PLUGIN_SUBDIR=usr/lib/x86_64-linux-gnu/slurm-wlm

# set_prefix P: use the bundle at P (OUT or OUT/root of `bundle OUT`).
set_prefix() {
  local p=$1
  [[ -d $p/root/usr ]] && p=$p/root
  p=$(readlink -f "$p") || die "--prefix: no directory $1"
  [[ -x $p/usr/sbin/slurmd-wlm || -x $p/usr/sbin/slurmd ]] || die "--prefix: $p holds no usr/sbin/slurmd(-wlm) (make one with: $PROG bundle OUT)"
  PREFIX=$p
  LIBS=$p/$PLUGIN_SUBDIR:$p/usr/lib/x86_64-linux-gnu:$p/lib/x86_64-linux-gnu
  # The daemons (and slurmstepd, slurmscriptd, which inherit their
  # environment; a task's environment is the job's, not slurmstepd's) find
  # libslurmfull.so through it: the binaries' RUNPATH names /usr/lib/...
  DAEMON_ENV=(env "LD_LIBRARY_PATH=$LIBS" "NVTS_SLURM_PREFIX=$p")
}

# prefix_bin NAME: the bundle's program NAME (Debian ships the daemons as
# NAME-wlm behind update-alternatives links, which dpkg-deb -x does not make).
prefix_bin() {
  local d
  for d in usr/sbin usr/bin; do
    [[ -x $PREFIX/$d/$1-wlm ]] && { echo "$PREFIX/$d/$1-wlm"; return; }
    [[ -x $PREFIX/$d/$1 ]] && { echo "$PREFIX/$d/$1"; return; }
  done
  return 1
}

# write_wrappers DIR: DIR/bin/NAME for every client program of the bundle
# (srun, sinfo, scontrol, squeue, scancel, sbatch, ..., munge, unmunge,
# mungekey). Each runs the program through the system's loader with
# --library-path: the library path is the loader's, not an environment
# variable, so srun does not hand an LD_LIBRARY_PATH of old libraries to the
# job's tasks (srun propagates its whole environment).
write_wrappers() {
  local dir=$1 f name
  mkdir -m 0755 -p "$dir/bin"
  for f in "$PREFIX"/usr/bin/* "$PREFIX"/usr/sbin/mungekey; do
    [[ -f $f && -x $f ]] || continue
    name=${f##*/}
    printf '#!/bin/sh
# Generated by tests/slurm/cluster.sh --prefix: %s from the bundle.
exec %s --library-path %q --argv0 %s %q "$@"
' \
      "$name" "$LOADER" "$LIBS" "$name" "$f" >"$dir/bin/$name"
    chmod 0755 "$dir/bin/$name"
  done
  echo "$PREFIX" >"$dir/run/prefix"
}

# use_cluster_prefix DIR: a cluster started with --prefix is stopped and
# queried with its own clients.
use_cluster_prefix() {
  local dir=$1
  [[ -s $dir/run/prefix && -d $dir/bin ]] || return 0
  PATH=$dir/bin:$PATH
  export PATH
}

# cmd_bundle OUT: download (apt-get download: no install, no root needed
# beyond a readable apt cache) Slurm 22.05's daemons, clients and plugins,
# munge, and every shared library they need beyond glibc that a minimal
# system may lack, unpack them into OUT/root with dpkg-deb -x, drop docs,
# man pages, init scripts and the .debs. Found with ldd on every ELF file of
# the unpacked tree (with LD_LIBRARY_PATH on the tree): what is left outside
# the tree and glibc is only needed by plugins a minimal cluster never loads
# (lua). cgroup/v2 is loaded: slurmd 22.05 initialises the cgroup plugin of
# the machine's hierarchy whatever the config (an H100 VM with Ubuntu 24.04
# has only cgroup v2, and slurmd stopped there without libdbus). libstdc++ (the SPANK plugin's) is not included: the
# system's is newer.
BUNDLE_PACKAGES=(slurmctld slurmd slurm-client slurm-wlm-basic-plugins libslurm38 munge libmunge2
  libhwloc15 libnuma1 liblz4-1 libpam0g libaudit1 libcap-ng0 libcap2 libudev1 libgcrypt20 libgpg-error0
  libbz2-1.0 zlib1g libjson-c5 libyaml-0-2 libreadline8 libtinfo6
  libdbus-1-3 libsystemd0 liblzma5 libzstd1)
cmd_bundle() {
  local out=${1:-} d missing
  [[ -n $out ]] || die "bundle: no OUT directory"
  command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || die "bundle: needs apt-get and dpkg-deb (Debian 12)"
  [[ ! -e $out/root ]] || die "bundle: $out/root exists (remove it first)"
  mkdir -p "$out/debs" || die "bundle: cannot create $out"
  out=$(readlink -f "$out")
  (cd "$out/debs" && apt-get download "${BUNDLE_PACKAGES[@]}") >"$out/download.log" 2>&1 ||
    die "bundle: apt-get download failed: $(tail -3 "$out/download.log")"
  mkdir -p "$out/root"
  for d in "$out"/debs/*.deb; do dpkg-deb -x "$d" "$out/root" || die "bundle: dpkg-deb -x $d failed"; done
  {
    echo "# tests/slurm/cluster.sh bundle, $(date -u +%Y-%m-%dT%H:%M:%SZ), on $(. /etc/os-release && echo "$PRETTY_NAME")"
    for d in "$out"/debs/*.deb; do dpkg-deb -f "$d" Package Version | paste -sd' '; done
  } >"$out/MANIFEST"
  rm -rf "$out/root"/{etc,var,lib/systemd,usr/share,usr/include,usr/lib/x86_64-linux-gnu/pkgconfig} "$out/debs"
  set_prefix "$out/root"
  # Libraries that resolve outside the tree (or not at all), glibc's aside.
  missing=$(find "$out/root" -type f \( -perm -u+x -o -name '*.so*' \) | while read -r d; do
    LD_LIBRARY_PATH=$LIBS ldd "$d" 2>/dev/null | awk -v f="${d#"$out"/root/}" -v t="$out/root/" '
      /not found/ { print f ": " $1 " not found" }
      /=> \// && index($3, t) != 1 && $1 !~ /^(libc|libm|libdl|libpthread|librt|libresolv|libutil|ld-linux-x86-64)\./ { print f ": " $1 " from " $3 }'
  done | sort)
  {
    echo "# needed from outside the bundle (only by plugins a minimal cluster does not load: lua, cgroup/v2):"
    echo "${missing:-(none)}"
    echo "# size: $(du -sh "$out/root" | cut -f1)"
  } >>"$out/MANIFEST"
  echo "$PROG: bundle in $out/root ($(du -sh "$out/root" | cut -f1)); $(grep -c ' ' "$out/MANIFEST") lines in $out/MANIFEST"
}

# ------------------------------------------------------------ config files ---

write_config() {
  local dir=$1 node=$2 cpus=$3 shards=$4 ctld_port=$5 slurmd_port=$6 debug=$7 cluster=$8
  # A bundle's plugins (--prefix); the compiled-in PluginDir is /usr/lib/...
  local plugindir="# PluginDir: compiled in" v
  if [[ -n $PREFIX ]]; then
    # The bundle may sit anywhere (a checkout at "/tmp/a b"): quoted.
    v=$(conf_value "$PREFIX/$PLUGIN_SUBDIR") || die "start: --prefix: $PREFIX cannot be written in slurm.conf"
    plugindir="PluginDir=$v"
  fi
  # Every other path below is under DIR, which start checked is a plain path.
  cat >"$dir/slurm.conf" <<EOF
# Generated by tests/slurm/cluster.sh: a private one-node cluster.
ClusterName=$cluster
$plugindir
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.daemon.pid
SlurmdPidFile=$dir/run/slurmd.daemon.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=$debug
SlurmdDebug=$debug
TmpFS=$dir/tmp
PlugStackConfig=$dir/plugstack.conf
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
SlurmdParameters=config_overrides
GresTypes=gpu,shard
ReturnToService=2
# Short timeouts: a test waits on none of them in the normal case.
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=5
TCPTimeout=2
InactiveLimit=0
KillWait=2
WaitTime=0
UnkillableStepTimeout=30
MinJobAge=300
NodeName=$node NodeAddr=127.0.0.1 NodeHostname=$node CPUs=$cpus Sockets=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=1000 Gres=gpu:${GPUS:-1},shard:$((shards * ${GPUS:-1})) State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
  local gpu g
  {
    echo "# Generated by tests/slurm/cluster.sh. A stand-in GPU is a character device"
    echo "# node (major 195 = nvidia, minor N) made with mknod in DIR/dev, or a real"
    echo "# GPU's device node."
    echo "AutoDetect=off"
    for ((g = 0; g < ${GPUS:-1}; g++)); do
      gpu=${GPU_FILE:-$dir/dev/nvidia$g}
      echo "Name=gpu File=$gpu"
      echo "Name=shard Count=$shards File=$gpu"
    done
  } >"$dir/gres.conf"
  # slurmd 22.05 sets up the cgroup plugin of the machine's hierarchy even
  # with proctrack/linuxproc and task/none; on a cgroup-v2-only machine
  # without systemd's D-Bus (a VM, a container) it must not ask systemd.
  cat >"$dir/cgroup.conf" <<EOF
# Generated by tests/slurm/cluster.sh.
IgnoreSystemd=yes
EOF
  [[ -e $dir/plugstack.conf ]] || : >"$dir/plugstack.conf"
}

write_env() {
  local dir=$1 node=$2
  {
    # A test driver that itself runs inside a Slurm job must not make srun
    # join that job: drop the job's variables, keep the private config.
    echo 'unset $(env | sed -n "s/^\(SLURM_[A-Za-z0-9_]*\)=.*/\1/p") 2>/dev/null || true'
    # %q: the values as the shell that evals them reads them back, whatever
    # they hold (a bundle in a checkout at "/tmp/a b").
    printf 'export SLURM_CONF=%q\n' "$dir/slurm.conf"
    printf 'export NVTS_SLURM_DIR=%q\n' "$dir"
    printf 'export NVTS_SLURM_NODE=%q\n' "$node"
    printf 'export NVTS_SLURM_PLUGSTACK=%q\n' "$dir/plugstack.conf"
    printf 'export NVTS_SLURM_GPU_DEVICE=%q\n' "${GPU_FILE:-$dir/dev/nvidia0}"
    printf 'export NVTS_SLURM_MUNGE_SOCKET=%q\n' "$dir/munge/munge.socket"
    if [[ -n $PREFIX ]]; then
      # The bundle's clients, through DIR/bin's wrappers (no LD_LIBRARY_PATH:
      # srun would hand it to every task). NVTS_SLURM_LIBRARY_PATH is the
      # daemons' library path, for running one of the bundle's programs by hand.
      printf 'export PATH=%q:"$PATH"\n' "$dir/bin"
      printf 'export NVTS_SLURM_PREFIX=%q\n' "$PREFIX"
      printf 'export NVTS_SLURM_LIBRARY_PATH=%q\n' "$LIBS"
    fi
  } >"$dir/env"
}

# ------------------------------------------------------------------ start ---

# start_fail DIR MESSAGE: stop what was started, then say why in one line
# followed by the logs' tails (stopping first: a reader that closes the pipe
# early must not leave daemons behind).
start_fail() {
  local dir=$1 msg=$2 logs
  logs=$(tail_logs "$dir" 2>&1)
  cmd_stop "$dir" >/dev/null 2>&1
  STARTING=""
  echo "$PROG: start: $msg" >&2
  echo "$logs" >&2
  exit 1
}

# While start runs, any exit (a signal, set -u, a bug) stops what it started.
STARTING=""
on_exit() { [[ -n $STARTING ]] && cmd_stop "$STARTING" >/dev/null 2>&1; }
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap '' PIPE

cmd_start() {
  local dir=${1:-}
  [[ -n $dir ]] || die "start: no DIR"
  shift
  GPUS=1
  local shards=8 cpus=8 node timeout=30 debug=info owner="" max_seconds=3600 no_mknod=0 prefix=${NVTS_SLURM_PREFIX:-}
  GPU_FILE=""
  node=$(hostname -s)
  while (($#)); do
    case $1 in
      --shards) shards=$2; shift 2 ;;
      --gpus) GPUS=$2; shift 2 ;;
      --cpus) cpus=$2; shift 2 ;;
      --node) node=$2; shift 2 ;;
      --timeout) timeout=$2; shift 2 ;;
      --debug) debug=$2; shift 2 ;;
      --owner) owner=$2; shift 2 ;;
      --max-seconds) max_seconds=$2; shift 2 ;;
      --no-mknod) no_mknod=1; shift ;;
      --gpu-file) GPU_FILE=$2; shift 2 ;;
      --prefix) prefix=$2; shift 2 ;;
      *) die "start: unknown option $1" ;;
    esac
  done
  [[ $shards =~ ^[1-9][0-9]*$ ]] || die "start: --shards must be a positive integer, got '$shards'"
  [[ $GPUS =~ ^[1-8]$ ]] || die "start: --gpus must be 1 to 8, got '$GPUS'"
  [[ -z $GPU_FILE || $GPUS == 1 ]] || die "start: --gpu-file goes with one GPU"
  [[ $cpus =~ ^[1-9][0-9]*$ ]] || die "start: --cpus must be a positive integer, got '$cpus'"
  [[ $(id -u) == 0 ]] || die "start: must run as root (SlurmUser=root, slurmd runs steps as their users)"
  local b
  if [[ -n $GPU_FILE ]]; then
    [[ -c $GPU_FILE ]] || die "start: --gpu-file $GPU_FILE is not a character device"
    GPU_FILE=$(readlink -f "$GPU_FILE")
  fi
  local munged=munged slurmctld=slurmctld slurmd=slurmd stepd=()
  if [[ -n $prefix ]]; then
    set_prefix "$prefix"
    [[ -x $LOADER ]] || die "start: --prefix: no $LOADER (the clients run through it)"
    for b in munged mungekey munge unmunge slurmctld slurmd slurmstepd sinfo scontrol srun squeue scancel; do
      prefix_bin "$b" >/dev/null || die "start: --prefix: no $b in $PREFIX"
    done
    # Run as DIR/sbin/NAME, links to the bundle's NAME-wlm: Slurm takes
    # its role from argv[0] (a "slurmctld-wlm" does not know it is slurmctld
    # and drops every node's Gres=). slurmd runs slurmstepd from a
    # compiled-in path (/usr/sbin/slurmstepd) unless told with -d.
    munged=$(prefix_bin munged) slurmctld=$dir/sbin/slurmctld slurmd=$dir/sbin/slurmd
    stepd=(-d "$dir/sbin/slurmstepd")
    for b in setsid; do command -v "$b" >/dev/null || die "start: '$b' not found"; done
  else
    for b in munged mungekey munge slurmctld slurmd sinfo scontrol srun setsid; do
      command -v "$b" >/dev/null || die "start: '$b' not found (apt-get install slurmctld slurmd slurm-client munge)"
    done
  fi
  [[ -n $GPU_FILE ]] || ((no_mknod)) || command -v mknod >/dev/null || die "start: 'mknod' not found"

  mkdir -p "$dir" || die "start: cannot create $dir"
  dir=$(readlink -f "$dir")
  [[ -z $(ls -A "$dir") ]] || die "start: $dir is not empty (use a fresh directory per cluster)"
  ((${#dir} <= 60)) || die "start: DIR path too long (${#dir} > 60 bytes; Unix socket paths under it must fit in 108)"
  # Its paths go unquoted into slurm.conf, gres.conf and munge's socket option.
  plain_path "$dir" || die "start: DIR $dir holds a character Slurm's config files cannot take unquoted (use one of letters, digits and ._/+@%-, as mktemp -d /tmp/nvts.XXXXXX makes)"

  local t0
  t0=$(now_ms)
  STARTING=$dir
  # munged checks permissions: the socket's directory and every directory
  # above it must be executable by all, none writable by group/other unless
  # sticky; the key 0600. mktemp -d makes 0700, hence the chmod.
  chmod 0755 "$dir"
  mkdir -m 0755 "$dir"/{munge,run,log,state,spool,tmp,dev} || die "start: mkdir in $dir failed"
  if [[ -n $PREFIX ]]; then
    write_wrappers "$dir"
    mkdir -m 0755 "$dir/sbin"
    for b in slurmctld slurmd slurmstepd; do ln -s "$(prefix_bin "$b")" "$dir/sbin/$b" || die "start: ln -s in $dir/sbin failed"; done
    PATH=$dir/bin:$PATH
    export PATH
  fi
  mungekey --create --keyfile="$dir/munge/munge.key" 2>"$dir/log/mungekey.err" ||
    die "start: mungekey failed: $(cat "$dir/log/mungekey.err")"
  # The stand-in GPU: a character device node, major 195 (nvidia), minor 0.
  # gres.conf File= may name any path: slurmd stat()s it. With a regular file
  # slurmd logs "is not a valid character or block device" and still counts
  # the gres, but steps then get no CUDA_VISIBLE_DEVICES / SLURM_STEP_GPUS /
  # GPU_DEVICE_ORDINAL (only SLURM_GPUS_ON_NODE and SLURM_SHARDS_ON_NODE); a
  # missing file is fatal to slurmd. So mknod (CAP_MKNOD) is required unless
  # the caller accepts that with --no-mknod.
  if [[ -n $GPU_FILE ]]; then
    # A real GPU: gres.conf names it. File= is a host list (split at
    # whitespace and commas, quotes or not): a path that is not plain is
    # named through a link in DIR/dev, keeping the number that ends its
    # name, as /dev/nvidiaN does (slurmd stat()s File=, through the link).
    if ! plain_path "$GPU_FILE"; then
      local gnum=0
      [[ ${GPU_FILE##*/} =~ ([0-9]+)$ ]] && gnum=${BASH_REMATCH[1]}
      ln -s "$GPU_FILE" "$dir/dev/nvidia$gnum" || die "start: ln -s $GPU_FILE $dir/dev/nvidia$gnum failed"
      GPU_FILE=$dir/dev/nvidia$gnum
    fi
  else
    local g
    for ((g = 0; g < GPUS; g++)); do
      if ((no_mknod)); then
        : >"$dir/dev/nvidia$g"
      elif ! mknod -m 0666 "$dir/dev/nvidia$g" c 195 "$g" 2>"$dir/log/mknod.err"; then
        die "start: mknod $dir/dev/nvidia$g c 195 $g failed ($(cat "$dir/log/mknod.err")): CAP_MKNOD is needed (--no-mknod: a regular file, and steps get no CUDA_VISIBLE_DEVICES)"
      fi
    done
  fi

  local attempt ports ctld_port slurmd_port ok=0 deadline reason="" t_munge=0 t_ctld=0 cluster
  cluster=nvts$((RANDOM % 100000))
  for attempt in 1 2 3; do
    ports=$(pick_ports 2) || die "start: no free TCP port pair found"
    read -r ctld_port slurmd_port <<<"$ports"
    write_config "$dir" "$node" "$cpus" "$shards" "$ctld_port" "$slurmd_port" "$debug" "$cluster"
    write_env "$dir" "$node"
    export SLURM_CONF=$dir/slurm.conf

    if ! alive munged "$dir"; then
      daemon munged "$dir" "$munged" --foreground \
        --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
        --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" \
        --seed-file="$dir/munge/munged.seed"
      deadline=$(($(now_ms) + 5000))
      until munge -n -S "$dir/munge/munge.socket" 2>/dev/null |
        unmunge -S "$dir/munge/munge.socket" >/dev/null 2>&1; do
        if ! alive munged "$dir" || (($(now_ms) > deadline)); then
          start_fail "$dir" "munged did not come up in 5 s"
        fi
        sleep 0.02
      done
    fi

    t_munge=$(($(now_ms) - t0))
    daemon slurmctld "$dir" "$slurmctld" -D -i -f "$dir/slurm.conf"
    # slurmd registers once at start; starting it as soon as slurmctld answers
    # saves the wait for slurmctld's next ping.
    deadline=$(($(now_ms) + timeout * 1000))
    until scontrol ping 2>/dev/null | grep -q 'is UP'; do
      alive slurmctld "$dir" || break
      (($(now_ms) > deadline)) && break
      sleep 0.05
    done
    t_ctld=$(($(now_ms) - t0))
    if alive slurmctld "$dir"; then
      daemon slurmd "$dir" "$slurmd" -D -N "$node" "${stepd[@]}" -f "$dir/slurm.conf"
      while (($(now_ms) <= deadline)); do
        if [[ $(sinfo -h -N -n "$node" -o '%t' 2>/dev/null) == idle ]]; then ok=1; break; fi
        alive slurmctld "$dir" && alive slurmd "$dir" || break
        sleep 0.05
      done
    fi
    ((ok)) && break
    # A port taken between pick_ports and bind(): try again with others.
    if grep -qs 'Address already in use' "$dir"/log/slurmctld.log "$dir"/log/slurmd.log "$dir"/log/*.out; then
      reason="port in use"
      stop_daemon slurmd "$dir"
      stop_daemon slurmctld "$dir"
      mkdir -p "$dir/log/attempt$attempt" && mv "$dir"/log/slurm*.* "$dir/log/attempt$attempt/" 2>/dev/null
      rm -rf "${dir:?}/state" "${dir:?}/spool" && mkdir -m 0755 "$dir/state" "$dir/spool"
      continue
    fi
    break
  done
  if ((!ok)); then
    local why="node $node not idle after ${timeout} s"
    alive slurmctld "$dir" || why="slurmctld exited"
    [[ $why == "slurmctld exited" ]] || alive slurmd "$dir" || why="slurmd exited"
    [[ -n $reason ]] && why="$why ($reason)"
    start_fail "$dir" "$why; sinfo: $(sinfo -h -N -o '%N %t %E' 2>&1 | head -3 | tr '\n' ' ')"
  fi
  local ms=$(($(now_ms) - t0))
  STARTING=""
  echo "$ms" >"$dir/run/start_ms"
  echo "munge_ready_ms=$t_munge slurmctld_up_ms=$t_ctld node_idle_ms=$ms" >"$dir/run/start_phases"

  if [[ -n $owner || $max_seconds != 0 ]]; then
    # The watchdog: a plain bash loop, itself marked, stopped by `stop`.
    NVTS_SLURM_HARNESS=$dir setsid bash -c '
      owner=$1 max=$2 self=$3 dir=$4
      end=$(( max > 0 ? SECONDS + max : 0 ))
      # read -t on a FIFO nobody writes: a 1 s wait with no child process.
      mkfifo "$dir/run/watchdog.fifo" && exec 9<>"$dir/run/watchdog.fifo" || exit 1
      while :; do
        [[ -n $owner ]] && ! kill -0 "$owner" 2>/dev/null && break
        (( end > 0 && SECONDS >= end )) && break
        read -r -t 1 -u 9
      done
      env -u NVTS_SLURM_HARNESS "$self" stop "$dir" --from-watchdog
    ' watchdog "$owner" "$max_seconds" "$SELF" "$dir" </dev/null >>"$dir/log/watchdog.out" 2>&1 &
    echo $! >"$(pidfile_of "$dir" watchdog)"
  fi
  echo "$PROG: cluster up in $ms ms: node $node idle, SLURM_CONF=$dir/slurm.conf, ports $ctld_port/$slurmd_port${PREFIX:+, Slurm from $PREFIX}"
}

# ------------------------------------------------------------------- stop ---

# proc_id PID (proc_id.sh).
# shellcheck source=proc_id.sh
source "${SELF%/*}/proc_id.sh"

# still_running PID START: PID is the process that had start time START
# and is not a zombie. (A dying process's environ is unreadable before it is
# gone, so the marker alone cannot tell when it has ended.)
still_running() {
  local id
  id=$(proc_id "$1") || return 1
  [[ ${id#* } == "$2" && ${id%% *} != Z ]]
}

# stop_pids WAIT_S PID...: TERM the PIDs (already identified as this
# cluster's by the caller), wait up to WAIT_S seconds for them to end, then
# KILL the rest. Each is followed by its start time, so a PID that ends and is
# reused meanwhile is never signalled again.
stop_pids() {
  local wait_s=$1 pid id left deadline
  shift
  local pids=() starts=() i
  for pid in "$@"; do
    id=$(proc_id "$pid") || continue
    pids+=("$pid"); starts+=("${id#* }")
  done
  ((${#pids[@]})) || return 0
  kill -TERM "${pids[@]}" 2>/dev/null
  deadline=$(($(now_ms) + wait_s * 1000))
  while :; do
    left=()
    for i in "${!pids[@]}"; do still_running "${pids[i]}" "${starts[i]}" && left+=("${pids[i]}"); done
    ((${#left[@]})) || return 0
    (($(now_ms) > deadline)) && break
    sleep 0.05
  done
  echo "$PROG: stop: KILL ${left[*]} (still alive ${wait_s} s after TERM)" >&2
  kill -KILL "${left[@]}" 2>/dev/null
  deadline=$(($(now_ms) + 2000))
  while (($(now_ms) <= deadline)); do
    left=()
    for i in "${!pids[@]}"; do still_running "${pids[i]}" "${starts[i]}" && left+=("${pids[i]}"); done
    ((${#left[@]})) || return 0
    sleep 0.05
  done
  return 1
}

describe() { local p; for p in "$@"; do printf '%s(%s) ' "$p" "$(cat "/proc/$p/comm" 2>/dev/null)"; done; }

# job_pids DIR [EXCLUDE_PID]: the processes of this cluster's jobs that carry
# no marker: every unmarked descendant of a marked process (the tasks under
# slurmstepd), and every process whose initial environment holds both
# SLURM_CONF=DIR/slurm.conf and SLURM_JOB_ID (a task whose parent died). The
# subtree of EXCLUDE_PID (the watchdog, and this script under it) is skipped.
job_pids() {
  local dir=$1 skip=${2:-} p pid st rest e conf=0 job=0 a local_hit
  local -A parent=() marked=()
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    { read -r st <"$p/stat"; } 2>/dev/null || continue
    rest=${st##*) }
    set -- $rest
    [[ $1 == Z ]] && continue
    parent[$pid]=$2
    has_marker "$pid" "$dir" && marked[$pid]=1
  done
  for pid in "${!parent[@]}"; do
    [[ -n ${marked[$pid]:-} || $pid == "$$" || $pid == "$BASHPID" ]] && continue
    # Ancestors: under EXCLUDE_PID or this script -> skip; under a marked one -> a task.
    a=${parent[$pid]}; local_hit=0
    while [[ -n $a && $a != 0 && $a != 1 ]]; do
      [[ $a == "$skip" || $a == "$$" ]] && { local_hit=2; break; }
      [[ -n ${marked[$a]:-} ]] && { local_hit=1; break; }
      a=${parent[$a]:-}
    done
    ((local_hit == 2)) && continue
    if ((local_hit == 1)); then echo "$pid"; continue; fi
    conf=0 job=0
    { while IFS= read -r -d '' e; do
        [[ $e == "SLURM_CONF=$dir/slurm.conf" ]] && conf=1
        [[ $e == SLURM_JOB_ID=* ]] && job=1
      done <"/proc/$pid/environ"; } 2>/dev/null
    ((conf && job)) && echo "$pid"
  done
}

stop_daemon() {
  local name=$1 dir=$2 f
  f=$(pidfile_of "$dir" "$name")
  [[ -s $f ]] || return 0
  has_marker "$(<"$f")" "$dir" || return 0
  stop_pids 10 "$(<"$f")"
}

cmd_stop() {
  local dir=${1:-}
  [[ -n $dir ]] || die "stop: no DIR"
  # DIR may be gone (deleted under a running cluster): then no pid file and
  # no scancel, but the marker still names every daemon and slurmstepd.
  dir=$(readlink -m "$dir")
  [[ -d $dir ]] || echo "$PROG: stop: no directory $dir; stopping the processes marked with it" >&2
  [[ ${2:-} == --from-watchdog ]] && echo "$PROG: watchdog: stopping the cluster in $dir" >&2
  local t0 rc=0
  t0=$(now_ms)
  use_cluster_prefix "$dir"
  export SLURM_CONF=$dir/slurm.conf
  # 1. Cancel every job, so slurmstepd ends its tasks and exits by itself.
  if alive slurmctld "$dir" && [[ -n $(squeue -h -o %i 2>/dev/null) ]]; then
    squeue -h -o %i 2>/dev/null | xargs -r scancel 2>/dev/null
    local deadline=$(($(now_ms) + 8000))
    while (($(now_ms) <= deadline)); do
      [[ -z $(squeue -h -o %i 2>/dev/null) ]] && break
      sleep 0.1
    done
  fi
  local watchdog rest
  watchdog=$(cat "$(pidfile_of "$dir" watchdog)" 2>/dev/null)
  # 2. The jobs' own processes, if any are left (slurmctld was dead, or a task
  #    ignored scancel): slurmstepd may ignore TERM, and a task outlives a
  #    KILLed slurmstepd.
  mapfile -t rest < <(job_pids "$dir" "$watchdog")
  if ((${#rest[@]})); then
    echo "$PROG: stop: job processes left: $(describe "${rest[@]}")" >&2
    stop_pids 3 "${rest[@]}" || rc=1
  fi
  # 3. The daemons, in dependency order, each by its recorded PID. The
  #    watchdog is left to last when it is the one stopping.
  if [[ ${2:-} != --from-watchdog ]]; then stop_daemon watchdog "$dir"; watchdog=""; fi
  stop_daemon slurmd "$dir" || rc=1
  stop_daemon slurmctld "$dir" || rc=1
  stop_daemon munged "$dir" || rc=1
  # 4. Anything else the daemons started (slurmstepd, slurmscriptd) carries
  #    the marker: signal those exact PIDs.
  mapfile -t rest < <(marked_pids "$dir" | grep -vx "${watchdog:-none}"; job_pids "$dir" "$watchdog")
  if ((${#rest[@]})); then
    echo "$PROG: stop: leftover processes of this cluster: $(describe "${rest[@]}")" >&2
    stop_pids 2 "${rest[@]}" || rc=1
  fi
  mapfile -t rest < <(marked_pids "$dir" | grep -vx "${watchdog:-none}"; job_pids "$dir" "$watchdog")
  if ((${#rest[@]})); then
    echo "$PROG: stop: processes survive KILL: $(describe "${rest[@]}")" >&2
    rc=1
  fi
  { echo "$(($(now_ms) - t0))" >"$dir/run/stop_ms"; } 2>/dev/null
  ((rc == 0)) && echo "$PROG: cluster in $dir stopped in $(($(now_ms) - t0)) ms"
  return $rc
}

# ------------------------------------------------------------ env, status ---

cmd_env() {
  local dir=${1:-}
  [[ -n $dir ]] || die "env: no DIR"
  dir=$(readlink -f "$dir")
  [[ -s $dir/env ]] || die "env: $dir holds no cluster (run start first)"
  cat "$dir/env"
}

cmd_status() {
  local dir=${1:-} name rc=0
  [[ -n $dir ]] || die "status: no DIR"
  dir=$(readlink -f "$dir")
  use_cluster_prefix "$dir"
  for name in munged slurmctld slurmd watchdog; do
    if alive "$name" "$dir"; then
      echo "$name: running, pid $(<"$(pidfile_of "$dir" "$name")")"
    else
      echo "$name: not running"
      [[ $name == watchdog ]] || rc=1
    fi
  done
  SLURM_CONF=$dir/slurm.conf sinfo -N 2>&1
  return $rc
}

case ${1:-} in
  start) shift; cmd_start "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  env) shift; cmd_env "$@" ;;
  status) shift; cmd_status "$@" ;;
  bundle) shift; cmd_bundle "$@" ;;
  logs) shift; [[ -n ${1:-} ]] || die "logs: no DIR"; tail_logs "$(readlink -f "$1")" "${2:-30}" ;;
  *) sed -n '3,/^set -uo/p' "$SELF" | sed '$d' | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
