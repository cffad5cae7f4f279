#!/usr/bin/env bash
# Stop the SLURM cluster started by slurm/up.sh: every slurmd, slurmctld, munged, each by its
# pid file only (never by process name), SIGTERM then SIGKILL after a bounded wait; then the
# simulated nodes, if up.sh --nodes made them (slurm/nodes.sh down: no namespace, link, mount,
# process or /etc/hosts line left).
#
#   slurm/down.sh            # stop the daemons, keep the state directory (logs)
#   slurm/down.sh --purge    # ... and remove the state directory
#
# The cluster is $HPCCOLLECT_SLURM_DIR, else the one up.sh recorded in $POINTER. Idempotent: a
# cluster that is already down (or was never started) is fine. Prints `unset` lines to eval.
set -euo pipefail

POINTER="${TMPDIR:-/tmp}/hpccollect-slurm.current"
NODES_SH="$(dirname "$(readlink -f "$0")")/nodes.sh"
WAIT="${HPCCOLLECT_SLURM_STOP_TIMEOUT:-10}"

log() { echo "slurm/down.sh: $*" >&2; }

purge=0
for arg in "$@"; do
    case "$arg" in
    --purge) purge=1 ;;
    *)
        echo "slurm/down.sh: error: unknown argument '$arg' (only --purge)" >&2
        exit 2
        ;;
    esac
done

STATE="${HPCCOLLECT_SLURM_DIR:-}"
if [[ -z "$STATE" && -s "$POINTER" ]]; then
    STATE="$(cat "$POINTER")"
fi
if [[ -z "$STATE" || ! -d "$STATE" ]]; then
    log "no cluster state${STATE:+ at $STATE}: nothing to stop"
    [[ -n "$STATE" && "$(cat "$POINTER" 2>/dev/null)" == "$STATE" ]] && rm -f "$POINTER"
    echo "unset SLURM_CONF HPCCOLLECT_SLURM_DIR"
    exit 0
fi

# The pid in pid file $1 if it is still the program $2 (else the file is stale: removed).
daemon_pid() {
    local pid
    [[ -s "$1" ]] || return 1
    pid="$(cat "$1")"
    if [[ "$pid" =~ ^[0-9]+$ ]] && [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$2" ]]; then
        echo "$pid"
        return 0
    fi
    rm -f "$1" # that process is gone (or its pid now belongs to another program)
    return 1
}

# Each daemon takes about 2 s to shut down: all three are stopped at once, SIGTERM then, past
# the deadline, SIGKILL.
pids=()
for file in "$STATE"/run/slurmd-*.pid "$STATE"/run/slurmd.pid "$STATE/run/slurmctld.pid" "$STATE/run/munged.pid"; do
    [[ -e "$file" ]] || continue
    daemon="$(basename "$file" .pid)"
    if pid="$(daemon_pid "$file" "${daemon%%-*}")"; then
        kill -TERM "$pid" 2>/dev/null || true
        pids+=("$pid")
    fi
done
deadline=$((SECONDS + WAIT))
for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "$(cat "/proc/$pid/comm" 2>/dev/null) ($pid) still running after ${WAIT}s, sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
done
rm -f "$STATE"/run/{slurmd*,slurmctld,munged}.pid
log "stopped the cluster in $STATE"
if [[ -s "$STATE/nodes" ]]; then
    "$NODES_SH" down
    rm -f "$STATE/nodes"
fi
if ((purge)); then
    rm -rf -- "$STATE"
    log "removed $STATE"
    [[ "$(cat "$POINTER" 2>/dev/null)" == "$STATE" ]] && rm -f "$POINTER"
fi
echo "unset SLURM_CONF HPCCOLLECT_SLURM_DIR"
