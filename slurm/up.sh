#!/usr/bin/env bash
# Start a SLURM cluster (munged + slurmctld + slurmd) on this machine, for development and CI.
# Needs root (slurmd runs jobs as their user); no systemd or cgroups.
#
#   eval "$(slurm/up.sh)"        # prints `export SLURM_CONF=...` lines (progress goes to stderr)
#   sbatch --wait jobs/collect.sh
#   slurm/down.sh --purge        # stop the daemons, remove the state directory
#
#   eval "$(slurm/up.sh --nodes 2)"   # K simulated nodes (slurm/nodes.sh), one slurmd on each
#   sbatch -N 2 --wait jobs/collect.sh
#
# Without --nodes the cluster is one node, this host, on loopback. With --nodes K, slurm/nodes.sh
# makes node1..nodeK (network and UTS namespaces on a bridge); each runs its own slurmd, while
# slurmctld and munged run here, slurmctld listening on the bridge (hpcc-head). down.sh
# removes the nodes again. Jobs on the nodes see their node's host name, address and /etc/hosts,
# and this machine's files.
#
# Everything (config, spool, logs, pid files, munge key and socket) lives in one directory:
# $HPCCOLLECT_SLURM_DIR, else a new temporary directory (recorded in $POINTER so that down.sh and
# a second up.sh without HPCCOLLECT_SLURM_DIR find it). Idempotent: a cluster that is already up is reused.
# Environment: HPCCOLLECT_SLURM_CPUS (CPUs the node advertises, default max(8, nproc)),
# HPCCOLLECT_SLURM_CTLD_PORT / _SLURMD_PORT (default 6817 / 6818), HPCCOLLECT_SLURM_TIMEOUT
# (seconds to wait for the node to be idle, default 60), HPCCOLLECT_SLURM_CRED_EXPIRE (seconds a
# requeued job waits before it starts again, default 20; SLURM's own default is 120).
set -euo pipefail

POINTER="${TMPDIR:-/tmp}/hpccollect-slurm.current"
NODES_SH="$(dirname "$(readlink -f "$0")")/nodes.sh"
# libpmi2-0: srun --mpi=pmi2 for Intel MPI (I_MPI_PMI_LIBRARY); libpmix-dev: the libpmix.so
# SLURM's pmix plugin loads, for srun --mpi=pmix (Open MPI 5)
PACKAGES=(slurmctld slurmd slurm-client munge libpmi2-0 libpmix-dev)
TIMEOUT="${HPCCOLLECT_SLURM_TIMEOUT:-60}"

log() { echo "slurm/up.sh: $*" >&2; }
# The short host name, as slurmd finds its NodeName (`hostname` is missing in some images).
short_host() { hostname -s 2>/dev/null || uname -n | cut -d. -f1; }
die() {
    echo "slurm/up.sh: error: $*" >&2
    exit 1
}

# Is the daemon whose pid file is $1 running (and is it the program $2)?
alive() {
    local pid
    [[ -s "$1" ]] || return 1
    pid="$(cat "$1")"
    [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null &&
        [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$2" ]]
}

install_packages() {
    local missing=()
    command -v munged >/dev/null || missing+=(munge)
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v sbatch >/dev/null || missing+=(slurm-client)
    ldconfig -p | grep -q 'libpmi2\.so\.0' || missing+=(libpmi2-0)
    compgen -G '/usr/lib/*/pmix2/lib/libpmix.so' >/dev/null || missing+=(libpmix-dev)
    ((${#missing[@]} == 0)) && return 0
    [[ "$(id -u)" == 0 ]] || die "SLURM is not installed (${missing[*]}) and installing it needs root"
    command -v apt-get >/dev/null || die "no apt-get: install ${PACKAGES[*]} (SLURM >= 22.05) yourself"
    log "installing ${PACKAGES[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # invoke-rc.d must not start the packaged services: ours run from $STATE.
    local policy=/usr/sbin/policy-rc.d made_policy=0
    if [[ ! -e "$policy" ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
    fi
    local apt=(apt-get install -y -q --no-install-recommends "${PACKAGES[@]}")
    if ! "${apt[@]}" >"$STATE/log/apt.log" 2>&1; then
        log "install failed, running apt-get update first"
        apt-get update -q >>"$STATE/log/apt.log" 2>&1 || true
        "${apt[@]}" >>"$STATE/log/apt.log" 2>&1 || {
            ((made_policy)) && rm -f "$policy"
            tail -n 20 "$STATE/log/apt.log" >&2
            die "apt-get install ${PACKAGES[*]} failed (log: $STATE/log/apt.log)"
        }
    fi
    ((made_policy)) && rm -f "$policy"
    return 0
}

# The nodes' names ("node1 node2 ...") with --nodes, else this host's short name.
node_names() {
    if ((NODES)); then
        seq -f 'node%g' 1 "$NODES" | paste -sd' '
    else
        short_host
    fi
}

print_env() {
    echo "export HPCCOLLECT_SLURM_DIR=$STATE"
    echo "export SLURM_CONF=$STATE/etc/slurm.conf"
}

write_config() {
    local host cpus ctld nodes what node comm
    host="$(short_host)"
    cpus="${HPCCOLLECT_SLURM_CPUS:-$(($(nproc) > 8 ? $(nproc) : 8))}"
    if ((NODES)); then
        ctld="$host($("$NODES_SH" addr head))"
        nodes="node[1-$NODES]"
        what="$NODES simulated nodes (slurm/nodes.sh)"
        # slurmctld would bind the address its host name resolves to, not the bridge's; each
        # slurmd has only its node's own addresses
        comm="# slurmctld and slurmd listen on every address of their namespace"
    else
        ctld="$host(127.0.0.1)"
        nodes="$host"
        what="a single-node cluster on loopback"
        comm="CommunicationParameters=NoInAddrAny,NoCtldInAddrAny"
    fi
    cat >"$STATE/etc/slurm.conf" <<EOF
# Written by hpccollect's slurm/up.sh: $what.
ClusterName=hpccollect
SlurmctldHost=$ctld
SlurmUser=root
SlurmdUser=root
SlurmctldPort=${HPCCOLLECT_SLURM_CTLD_PORT:-6817}
SlurmdPort=${HPCCOLLECT_SLURM_SLURMD_PORT:-6818}
AuthType=auth/munge
CredType=cred/munge
# cred_expire is also how long a requeued job waits before it may start again (default 120 s;
# slurmd refuses to launch it while the killed attempt's credential is still revoked).
AuthInfo=socket=$STATE/munge/munge.socket,cred_expire=${HPCCOLLECT_SLURM_CRED_EXPIRE:-20}
$comm
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# No systemd/cgroups here: processes are tracked through their parent ids.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MpiDefault=pmi2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
EnforcePartLimits=ALL
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=10
MinJobAge=5
# The node may advertise more CPUs than the machine has (several ranks per core).
SlurmdParameters=config_overrides
EOF
    {
        if ((NODES)); then
            for node in $(node_names); do
                echo "NodeName=$node NodeAddr=$("$NODES_SH" addr "$node") CPUs=$cpus State=UNKNOWN"
            done
        else
            echo "NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN"
        fi
        echo "PartitionName=debug Nodes=$nodes Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
    } >>"$STATE/etc/slurm.conf"
}

# slurmd for node $1. On a simulated node it runs inside the node's namespaces, where
# `ip netns exec` mounts a /sys of its own: slurmd 22.05 wants the cgroup v1 hierarchies there
# (it only reads them: processes are tracked by parent pid).
start_slurmd() {
    local node=$1
    alive "$STATE/run/slurmd-$node.pid" slurmd && return 0
    mkdir -p "$STATE/spool/$node"
    if ((NODES)); then
        # shellcheck disable=SC2016
        "$NODES_SH" exec "$node" bash -c '
            set -e
            mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup
            for h in cpu cpuacct cpuset memory devices freezer blkio pids; do
                mkdir /sys/fs/cgroup/$h
                mount -t cgroup -o "$h" cgroup "/sys/fs/cgroup/$h"
            done
            mkdir /sys/fs/cgroup/systemd
            mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd
            exec slurmd -f "$1" -N "$2"' slurmd "$SLURM_CONF" "$node"
    else
        slurmd -f "$SLURM_CONF"
    fi
}

start_munge() {
    alive "$STATE/run/munged.pid" munged && return 0
    mkdir -p /run/munge
    if [[ ! -s "$STATE/munge/munge.key" ]]; then
        dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1 count=1024 status=none
    fi
    chmod 0400 "$STATE/munge/munge.key"
    # --force: the state directory may sit under a world-writable (sticky) /tmp.
    munged --force --key-file="$STATE/munge/munge.key" --socket="$STATE/munge/munge.socket" \
        --pid-file="$STATE/run/munged.pid" --log-file="$STATE/log/munged.log" \
        --seed-file="$STATE/munge/munged.seed" 2>>"$STATE/log/munged.log" ||
        die "munged did not start: $(tail -n 5 "$STATE/log/munged.log")"
}

# Are slurmctld and every node's slurmd running?
daemons_alive() {
    local node
    alive "$STATE/run/slurmctld.pid" slurmctld || return 1
    for node in $(node_names); do
        alive "$STATE/run/slurmd-$node.pid" slurmd || return 1
    done
}

wait_idle() {
    local deadline=$((SECONDS + TIMEOUT)) state="" want ready f
    want="$(node_names | wc -w)"
    while ((SECONDS < deadline)); do
        state="$(sinfo -h -N -o '%T' 2>/dev/null | paste -sd, || true)"
        # "idle*" (a trailing mark) would be a node that has not answered yet.
        ready="$(tr ',' '\n' <<<"$state" | grep -cE '^(idle|mixed|allocated|completing)$' || true)"
        [[ "$ready" == "$want" ]] && return 0
        daemons_alive || break
        sleep 0.2
    done
    for f in munged slurmctld $(node_names | sed 's/[^ ]*/slurmd-&/g'); do
        echo "--- $STATE/log/$f.log" >&2
        tail -n 15 "$STATE/log/$f.log" >&2 2>/dev/null || true
    done
    die "the nodes are not idle after ${TIMEOUT}s (state: '${state:-no answer}'); logs above" \
        "(slurm/down.sh stops what was started)"
}

usage() {
    echo "usage: slurm/up.sh [--nodes K]" >&2
    exit 2
}

main() {
    NODES=0
    while (($#)); do
        case "$1" in
        --nodes)
            [[ $# -ge 2 && "$2" =~ ^[0-9]+$ ]] && (($2 >= 1 && $2 <= 250)) ||
                { echo "slurm/up.sh: error: --nodes takes a number of nodes, 1..250" >&2 && exit 2; }
            NODES=$2
            shift 2
            ;;
        *)
            echo "slurm/up.sh: error: unknown argument '$1'" >&2
            usage
            ;;
        esac
    done
    if [[ -n "${HPCCOLLECT_SLURM_DIR:-}" ]]; then
        STATE="$HPCCOLLECT_SLURM_DIR"
    elif [[ -s "$POINTER" && -d "$(cat "$POINTER")" ]]; then
        STATE="$(cat "$POINTER")"
    else
        STATE="$(mktemp -d "${TMPDIR:-/tmp}/hpccollect-slurm.XXXXXX")"
    fi
    mkdir -p "$STATE"/{etc,ctld,spool,run,log,munge}
    STATE="$(cd "$STATE" && pwd -P)"
    chmod 0700 "$STATE/munge"
    export SLURM_CONF="$STATE/etc/slurm.conf"
    local had=0
    [[ -s "$STATE/nodes" ]] && had="$(cat "$STATE/nodes")"
    if [[ "$had" != "$NODES" ]] && daemons_alive 2>/dev/null; then
        die "the cluster in $STATE is up with $( ((had)) && echo "$had simulated nodes" || echo "this host as its node"):" \
            "slurm/down.sh first to start another"
    fi

    if daemons_alive && alive "$STATE/run/munged.pid" munged; then
        log "already up in $STATE"
        wait_idle
        print_env
        return 0
    fi
    [[ "$(id -u)" == 0 ]] || die "needs root (slurmd runs jobs as their user; munged as root)"
    install_packages
    local port ctld_addr=127.0.0.1 node
    if ((NODES)); then
        # recorded first: down.sh removes the nodes whatever fails from here on
        echo "$NODES" >"$STATE/nodes"
        "$NODES_SH" up "$NODES" || die "slurm/nodes.sh up $NODES failed (slurm/down.sh removes what was made)"
        ctld_addr="$("$NODES_SH" addr head)"
    fi
    for port in "${HPCCOLLECT_SLURM_CTLD_PORT:-6817}" "${HPCCOLLECT_SLURM_SLURMD_PORT:-6818}"; do
        if (exec 3<>"/dev/tcp/$ctld_addr/$port") 2>/dev/null; then
            die "port $port is taken (another cluster?): stop it, or choose other ports with" \
                "HPCCOLLECT_SLURM_CTLD_PORT and HPCCOLLECT_SLURM_SLURMD_PORT"
        fi
    done
    write_config
    start_munge
    alive "$STATE/run/slurmctld.pid" slurmctld || slurmctld -c -f "$SLURM_CONF" ||
        die "slurmctld did not start: $(tail -n 5 "$STATE/log/slurmctld.log" 2>/dev/null)"
    for node in $(node_names); do
        start_slurmd "$node" ||
            die "slurmd on $node did not start: $(tail -n 5 "$STATE/log/slurmd-$node.log" 2>/dev/null)"
    done
    [[ -n "${HPCCOLLECT_SLURM_DIR:-}" ]] || echo "$STATE" >"$POINTER"
    wait_idle
    log "up in ${SECONDS}s: $(node_names | wc -w) node(s) ($(node_names)), state in $STATE"
    print_env
}

main "$@"
