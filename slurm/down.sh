#!/usr/bin/env bash
# Stop the single-node SLURM cluster started by slurm/up.sh: slurmd, slurmctld, munged, each by
# its pid file only (never by process name), SIGTERM then SIGKILL after a bounded wait.
#
#   slurm/down.sh            # stop the daemons, keep the state directory (logs)
#   slurm/down.sh --purge    # ... and remove the state directory
#
# The cluster is $HPCCOLLECT_SLURM_DIR, else the one up.sh recorded in $POINTER. Idempotent: a
# cluster that is already down (or was never started) is fine. Prints `unset` lines to eval.
set -euo pipefail

POINTER="${TMPDIR:-/tmp}/hpccollect-slurm.current"
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

# Stop the daemon whose pid file is $1, if that pid is still the program $2.
stop() {
    local file="$1" name="$2" pid deadline
    [[ -s "$file" ]] || return 0
    pid="$(cat "$file")"
    if ! [[ "$pid" =~ ^[0-9]+$ ]] || [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" != "$name" ]]; then
        rm -f "$file" # stale: that process is gone (or the pid was reused by another program)
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$((SECONDS + WAIT))
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "$name ($pid) still running after ${WAIT}s, sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        sleep 0.2
    fi
    rm -f "$file"
}

# Jobs still queued or running are cancelled through SLURM (their steps end with them), bounded.
export SLURM_CONF="$STATE/etc/slurm.conf"
if [[ -s "$STATE/run/slurmctld.pid" ]] && command -v squeue >/dev/null; then
    jobs="$(timeout 5 squeue -h -o %A 2>/dev/null || true)"
    if [[ -n "$jobs" ]]; then
        log "cancelling jobs: $(echo $jobs)"
        # shellcheck disable=SC2086
        timeout 5 scancel --full $jobs 2>/dev/null || true
        deadline=$((SECONDS + WAIT))
        while [[ -n "$(timeout 5 squeue -h -o %A 2>/dev/null || true)" ]] && ((SECONDS < deadline)); do
            sleep 0.2
        done
    fi
fi

# slurmd first: it ends the job steps still running on the node.
stop "$STATE/run/slurmd.pid" slurmd
stop "$STATE/run/slurmctld.pid" slurmctld
stop "$STATE/run/munged.pid" munged
log "stopped the cluster in $STATE"
if ((purge)); then
    rm -rf -- "$STATE"
    log "removed $STATE"
    [[ "$(cat "$POINTER" 2>/dev/null)" == "$STATE" ]] && rm -f "$POINTER"
fi
echo "unset SLURM_CONF HPCCOLLECT_SLURM_DIR"
