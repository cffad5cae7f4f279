#!/bin/bash
# Collect a dataset with hpccollect on SLURM: rank 0 gathers, ranks 1..N-1 collect.
#
#   mkdir -p logs && sbatch jobs/collect.sh --env Pendulum-v1 --total-frames 1000000
#
# Arguments go to `python -m hpccollect collect` as they are; the dataset lands in
# runs/<job name>-<job id>/data.h5 (under the directory you submit from), the log in
# logs/<job name>-<job id>.out (SLURM does not create logs/: make it first).
# On a real cluster, adapt the header (or override it on the command line, `sbatch -p gpu ...`):
#   --partition=NAME / --account=NAME   where your site wants collection jobs to run;
#   --nodes=K and --ntasks=N            N-1 collector ranks spread over K nodes (rank 0 listens on
#                                       its host address when K > 1; --interface/--master-addr
#                                       choose another), add --shards on a shared file system;
#   --cpus-per-task=C                   one per worker process of a collector rank (--num-workers);
#   --gpus-per-task=1 (or --gres=gpu:1) only if your policy runs on a GPU;
#   --time=HH:MM:SS                     SIGTERM comes 120 s before it (see --signal): every rank
#                                       stops after its current batch, the dataset is kept, and
#                                       the job requeues itself (--requeue) to resume the run
#                                       (`collect --resume`); drop --requeue to just end.
#SBATCH --job-name=hpccollect
#SBATCH --ntasks=3
#SBATCH --cpus-per-task=2
#SBATCH --time=01:00:00
#SBATCH --output=logs/%x-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=B:TERM@120
set -uo pipefail

# SLURM starts this script in the job's working directory (--chdir, default: where sbatch ran).
# The project's environment: $HPCCOLLECT_VENV, else .venv in that directory.
venv="${HPCCOLLECT_VENV:-$PWD/.venv}"
if [[ -f "$venv/bin/activate" ]]; then
    # shellcheck disable=SC1091
    source "$venv/bin/activate"
fi
# Every rank on one node: MPICH's UCX listens on loopback only.
if [[ "${SLURM_JOB_NUM_NODES:-1}" == 1 && -z "${UCX_NET_DEVICES:-}" ]]; then
    export UCX_NET_DEVICES=lo
fi

run="runs/${SLURM_JOB_NAME:-hpccollect}-${SLURM_JOB_ID:-local}"
mkdir -p "$run" || exit 1
data="$run/data.h5"
echo "hpccollect job ${SLURM_JOB_ID:-?} on ${SLURM_JOB_NODELIST:-$(hostname -s)}: ${SLURM_NTASKS:-1} ranks, dataset $data (start ${SLURM_RESTART_COUNT:-0})"
# A requeued job (same id, same run directory) continues its run: the frames on disk count, new
# episodes go to new files, and data.h5 becomes a view over every attempt's files.
if [[ -e "$data" || -e "$data.partial" || -d "$run/data.shards" ]]; then
    where=(--resume "$data")
else
    where=(--out "$data")
fi

# srun in the background so that this shell can pass SLURM's warning signal (--signal=B:TERM, or
# `scancel --signal=TERM --batch`) on to every rank; rank 0 then stops after its current batch.
# Not through srun: srun takes SIGTERM as "kill the step". `scancel --signal` without --batch
# signals the tasks of every step (each rank sees one SIGTERM; a second one changes nothing).
# srun does not inherit --cpus-per-task from sbatch (SLURM >= 22.05): pass it on.
# The ranks' MPI: PMI-2 by default (MPICH; Intel MPI with I_MPI_PMI_LIBRARY=libpmi2.so.0, SLURM's
# libpmi2); Open MPI 5 needs PMIx: sbatch --export=ALL,HPCCOLLECT_SRUN_MPI=pmix jobs/collect.sh
srun --mpi="${HPCCOLLECT_SRUN_MPI:-pmi2}" --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}" \
    python -m hpccollect collect "${where[@]}" "$@" &
step=$!
warned=0
forward() {
    warned=1
    echo "hpccollect job: SIGTERM, every rank stops after its current batch"
    scancel --signal=TERM "$SLURM_JOB_ID" || echo "hpccollect job: scancel failed, ranks not signalled"
}
trap forward TERM
rc=0
while true; do
    wait "$step"
    rc=$?
    # wait returns early (above 128) when a trapped signal arrives; the step may still run.
    kill -0 "$step" 2>/dev/null || break
done
echo "hpccollect job: collect exited with $rc"
# Warned by SLURM (the time limit is near, or preemption) and stopped cleanly: when the job may
# be requeued (--requeue), requeue it; it then resumes this run. A run that failed is not
# requeued (it would fail again), and a user's `scancel --signal=TERM` reaches only the ranks:
# the run stops and the job ends.
if [[ "$warned" == 1 && "$rc" == 0 ]] && scontrol show job "$SLURM_JOB_ID" 2>/dev/null | grep -q 'Requeue=1'; then
    echo "hpccollect job: requeueing job $SLURM_JOB_ID; it resumes $data"
    scontrol requeue "$SLURM_JOB_ID" && exit 0
    echo "hpccollect job: scontrol requeue failed; resume by hand: sbatch jobs/collect.sh, or python -m hpccollect collect --resume $data"
fi
exit "$rc"
