#!/usr/bin/env bash
# README command 2: set up both test environments and run the whole suite in each, printing
# each phase's wall time (install 1, suite 1, install 2, suite 2).
#   1. .venv: hpccollect with its test extra (pytest-xdist, mpich, mpi4py, submitit, minari).
#   2. the whole suite, on 3 workers (tests/scheduling.py: tests that time something run alone,
#      the SLURM cluster's and the simulated nodes' tests one after another on one worker).
#   3. .venv-torchrl: torchrl 0.14.1 beside hpccollect, every dependency at pyproject's lowest
#      version (constraints-lowest.txt).
#   4. there: the torchrl tests and the fast ones.
# HPCCOLLECT_TEST_WORKERS sets the worker count of suite 1 (0: one process, no workers).
set -uo pipefail
cd "$(dirname "$0")/.."
workers=${HPCCOLLECT_TEST_WORKERS:-3}
parallel=()
if [ "$workers" != 0 ]; then parallel=(-n "$workers" --dist loadgroup); fi

phase() {
  local name=$1 start=$SECONDS status=0
  shift
  echo "=== hpccollect tests: $name"
  "$@" || status=$?
  echo "=== hpccollect tests: $name: $((SECONDS - start)) s (exit $status)"
  return "$status"
}

install_1() {
  python3 -m venv .venv && .venv/bin/pip install -q -c constraints.txt -e '.[test]'
}
suite_1() {
  .venv/bin/python -m pytest "${parallel[@]}"
}
install_2() {
  python3 -m venv .venv-torchrl && .venv-torchrl/bin/pip install -q -c constraints.txt \
    -c constraints-lowest.txt -e '.[test]' torchrl==0.14.1
}
suite_2() {
  HPCCOLLECT_REQUIRE_TORCHRL=1 .venv-torchrl/bin/python -m pytest -n 2 --dist loadgroup \
    -m "torchrl or not slow"
}

start=$SECONDS
phase "install 1" install_1 && phase "suite 1" suite_1 && phase "install 2" install_2 &&
  phase "suite 2" suite_2
status=$?
echo "=== hpccollect tests: all: $((SECONDS - start)) s (exit $status)"
exit "$status"
