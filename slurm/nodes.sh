#!/usr/bin/env bash
# Simulated cluster nodes on this machine, for development and CI: each node is a network
# namespace (its own eth0 and address on a bridge) with a UTS namespace (its own host name).
# Needs root. Everything it makes, it removes with `down`: no namespace, link, mount, process or
# /etc/hosts line is left.
#
#   slurm/nodes.sh up K          # nodes node1..nodeK at 10.213.0.1..K, the bridge at 10.213.0.254
#   slurm/nodes.sh exec NODE CMD...   # run CMD on NODE (its network, host name, /etc/hosts)
#   slurm/nodes.sh down          # end every process on the nodes, remove everything
#   slurm/nodes.sh list          # the nodes that are up, one per line
#   slurm/nodes.sh addr NODE|head     # a node's address, or the bridge's (where the head listens)
#
# mpiexec reaches the nodes through slurm/node-ssh (hydra calls it as it would call ssh):
#   mpiexec -launcher ssh -launcher-exec slurm/node-ssh -iface hpcc0 -hosts node1,node2 -n 3 ...
# with UCX_TLS=tcp,self in the environment: the nodes share this machine's /dev/shm, and UCX
# would otherwise carry MPI between them through shared memory, never over their links.
# Name resolution on a node: /etc/hosts names every node and the head (the bridge address, where
# slurmctld listens), and its resolv.conf points at a name server that is not there, so any other
# name fails at once instead of after a DNS time-out. The root namespace's /etc/hosts gets the
# same names between two marker lines. Traffic goes only between these addresses.
# Environment: HPCCOLLECT_NODES_SUBNET (first three octets, default 10.213.0).
set -euo pipefail

SUBNET="${HPCCOLLECT_NODES_SUBNET:-10.213.0}"
BRIDGE=hpcc0
HEAD_ADDR="$SUBNET.254"
RUN=/run/hpccollect-nodes
MARK_BEGIN="# >>> hpccollect simulated nodes (slurm/nodes.sh)"
MARK_END="# <<< hpccollect simulated nodes"

log() { echo "slurm/nodes.sh: $*" >&2; }
die() {
    echo "slurm/nodes.sh: error: $*" >&2
    exit 1
}
usage() {
    echo "usage: slurm/nodes.sh up K | down | list | addr NODE|head | exec NODE CMD..." >&2
    exit 2
}

nodes_up() { ip netns list 2>/dev/null | awk '{print $1}' | sed -n 's/^hpcc-\(node[0-9]\+\)$/\1/p' | sort -V; }

need_root() { [[ "$(id -u)" == 0 ]] || die "needs root (network namespaces)"; }

hosts_lines() {
    local k=$1 i
    echo "$HEAD_ADDR hpcc-head"
    for ((i = 1; i <= k; i++)); do
        echo "$SUBNET.$i node$i"
    done
}

remove_hosts_block() {
    [[ -f /etc/hosts ]] || return 0
    grep -qF "$MARK_BEGIN" /etc/hosts || return 0
    # /etc/hosts may be a bind mount (containers): rewrite it in place, never replace it
    local kept
    kept="$(awk -v b="$MARK_BEGIN" -v e="$MARK_END" '$0 == b { skip = 1; next } $0 == e { skip = 0; next } !skip' /etc/hosts)"
    printf '%s\n' "$kept" >/etc/hosts
}

up() {
    local k=$1 i ns
    [[ "$k" =~ ^[0-9]+$ ]] && ((k >= 1 && k <= 250)) || die "K must be a number of nodes, 1..250; got '$k'"
    need_root
    command -v ip >/dev/null || die "no 'ip' command: apt-get install iproute2"
    command -v nsenter >/dev/null || die "no 'nsenter' command: apt-get install util-linux"
    if [[ -n "$(nodes_up)" ]]; then
        log "nodes are up already ($(nodes_up | paste -sd, -)): slurm/nodes.sh down first"
        [[ "$(nodes_up | wc -l)" == "$k" ]] && return 0
        die "another set of nodes is up"
    fi
    trap 'log "failed: removing what was made"; down >/dev/null 2>&1 || true' ERR
    mkdir -p "$RUN/uts"
    if ! mountpoint -q "$RUN"; then # the UTS namespace files need a private mount to live on
        mount --bind "$RUN" "$RUN"
        mount --make-private "$RUN"
    fi
    ip link add "$BRIDGE" type bridge
    ip addr add "$HEAD_ADDR/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    for ((i = 1; i <= k; i++)); do
        ns="hpcc-node$i"
        ip netns add "$ns"
        ip link add "hpcc-v$i" type veth peer name eth0 netns "$ns"
        ip link set "hpcc-v$i" master "$BRIDGE" up
        ip -n "$ns" addr add "$SUBNET.$i/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
        mkdir -p "/etc/netns/$ns"
        {
            echo "127.0.0.1 localhost"
            hosts_lines "$k"
        } >"/etc/netns/$ns/hosts"
        printf 'nameserver 127.0.0.1\noptions timeout:1 attempts:1\n' >"/etc/netns/$ns/resolv.conf"
        touch "$RUN/uts/node$i"
        unshare --uts="$RUN/uts/node$i" hostname "node$i"
    done
    remove_hosts_block
    {
        echo "$MARK_BEGIN"
        hosts_lines "$k"
        echo "$MARK_END"
    } >>/etc/hosts
    echo "$k" >"$RUN/count"
    trap - ERR
    log "up: node1..node$k at $SUBNET.1..$k on bridge $BRIDGE ($HEAD_ADDR)"
}

run_on() {
    local node=$1
    shift
    [[ -e "$RUN/uts/$node" ]] || die "no node '$node' (up: $(nodes_up | paste -sd, -))"
    exec ip netns exec "hpcc-$node" nsenter --uts="$RUN/uts/$node" -- "$@"
}

down() {
    local node ns pid left i
    need_root
    for node in $(nodes_up); do
        ns="hpcc-$node"
        # every process still on the node (they were started there by these scripts' users)
        for i in 1 2 3 4 5 6 7 8 9 10; do
            left="$(ip netns pids "$ns" 2>/dev/null || true)"
            [[ -z "$left" ]] && break
            for pid in $left; do
                kill -s "$([[ $i -lt 5 ]] && echo TERM || echo KILL)" "$pid" 2>/dev/null || true
            done
            sleep 0.2
        done
        ip netns del "$ns" 2>/dev/null || true
        rm -rf "/etc/netns/$ns"
    done
    if [[ -d "$RUN/uts" ]]; then
        for f in "$RUN"/uts/*; do
            [[ -e "$f" ]] || continue
            umount "$f" 2>/dev/null || true
            rm -f "$f"
        done
    fi
    ip link show "$BRIDGE" >/dev/null 2>&1 && ip link del "$BRIDGE"
    for link in $(ip -o link show 2>/dev/null | sed -n 's/^[0-9]*: \(hpcc-v[0-9]*\)@.*/\1/p'); do
        ip link del "$link" 2>/dev/null || true
    done
    remove_hosts_block
    if mountpoint -q "$RUN" 2>/dev/null; then
        umount "$RUN" || true
    fi
    rm -rf "$RUN"
    log "down: no node, bridge, mount or /etc/hosts line left"
}

case "${1:-}" in
up)
    [[ $# == 2 ]] || usage
    up "$2"
    ;;
down)
    [[ $# == 1 ]] || usage
    down
    ;;
list)
    nodes_up
    ;;
addr)
    [[ $# == 2 ]] || usage
    case "$2" in
    head) echo "$HEAD_ADDR" ;;
    node[0-9]*) echo "$SUBNET.${2#node}" ;;
    *) die "no node '$2': nodes are node1..nodeK, and 'head'" ;;
    esac
    ;;
exec)
    [[ $# -ge 3 ]] || usage
    node=$2
    shift 2
    run_on "$node" "$@"
    ;;
*) usage ;;
esac
