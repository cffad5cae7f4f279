#!/bin/bash
# Train PPO on SLURM with examples/ppo_distributed.py: rank 0 trains, ranks 1..N-1 collect.
#
#   mkdir -p logs && sbatch jobs/train.sh --total-frames 300000 --seed 1
#
# Arguments go to the training script as they are; its learning curve (curve.csv, curve.png)
# lands in runs/<job name>-<job id>/ (under the directory you submit from), the log in
# logs/<job name>-<job id>.out (SLURM does not create logs/: make it first). The script is
# examples/ppo_distributed.py in that directory, or $HPCCOLLECT_TRAIN_SCRIPT (your copy of it).
# On a real cluster, adapt the header (or override it on the command line, `sbatch -p gpu ...`):
#   --partition=NAME / --account=NAME   where your site wants the job to run;
#   --nodes=K and --ntasks=N            N-1 collector ranks spread over K nodes;
#   --cpus-per-task=C                   threads for each rank (rank 0's PPO update uses them);
#   --gpus-per-task=1 (or --gres=gpu:1) only if you move the networks to a GPU;
#   --time=HH:MM:SS                     a 300k-frame CartPole run takes a few minutes.
#SBATCH --job-name=hpccollect-train
#SBATCH --ntasks=3
#SBATCH --cpus-per-task=1
#SBATCH --time=00:30:00
#SBATCH --output=logs/%x-%j.out
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

script="${HPCCOLLECT_TRAIN_SCRIPT:-$PWD/examples/ppo_distributed.py}"
if [[ ! -f "$script" ]]; then
    echo "hpccollect train job: no training script at $script (submit from the repository, or set HPCCOLLECT_TRAIN_SCRIPT)" >&2
    exit 2
fi
run="runs/${SLURM_JOB_NAME:-hpccollect-train}-${SLURM_JOB_ID:-local}"
mkdir -p "$run" || exit 1
echo "hpccollect train job ${SLURM_JOB_ID:-?} on ${SLURM_JOB_NODELIST:-$(hostname -s)}: ${SLURM_NTASKS:-1} ranks, curve in $run"

# Every rank runs the script (it picks launcher="mpi" inside an srun step); srun does not inherit
# --cpus-per-task from sbatch (SLURM >= 22.05): pass it on. Arguments given later win, so --out
# may be overridden.
srun --mpi="${HPCCOLLECT_SRUN_MPI:-pmi2}" --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}" \
    python "$script" --out "$run" "$@"
rc=$?
echo "hpccollect train job: training exited with $rc"
exit "$rc"
