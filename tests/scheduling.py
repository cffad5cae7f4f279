"""How the suite shares this machine when it runs on several workers (``pytest -n N``,
pytest-xdist, as the README's test command does).

Most tests wait on processes they started (jobs, ranks, workers) more than they compute, so
several run side by side. Two kinds of test may not:

- ``alone``: a test that asserts how long something took (a liveness timeout, a wait's pace, a
  job's CPU share), or that loads every core by itself (65 ranks). It runs with no other test
  beside it: each worker holds a shared lock while it runs a test, an ``alone`` test the
  exclusive one. A turnstile in front of the lock lets a waiting ``alone`` test in before new
  shared holders, so it is never starved. A worker keeps the exclusive lock from one ``alone``
  test to the next, so a run of them is not interleaved with the others' tests.
- tests of one machine-wide resource (the SLURM cluster, the simulated nodes' bridge and
  namespaces): each such resource is an ``xdist_group`` (``--dist loadgroup``), so its tests run
  one after the other on one worker, which starts the resource once.

The groups and the ``alone`` tests are handed out first: they are the suite's longest chains,
and a long chain started last would keep one worker busy after the others ran out of work.

Run without ``-n``, nothing here changes anything: the tests run one at a time.
"""

from __future__ import annotations

import fcntl
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

#: marks whose tests share one machine-wide resource, and that resource's group name
GROUPS = {"slurm": "cluster", "nodes": "cluster"}
#: seconds a test waits for its turn before failing: longer than any chain of ``alone`` tests
TURN_LIMIT = 1800.0
_POLL = 0.05


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "alone: asserts how long something takes, or loads every core: no other test runs "
        "beside it under pytest -n (tests/scheduling.py)",
    )


class Turnstile:
    """A readers-writer lock between the processes of one test run, on two ``flock``ed files
    (``flock`` alone lets new readers in ahead of a waiting writer). Every wait is bounded by
    ``TURN_LIMIT``."""

    def __init__(self, prefix: Path) -> None:
        self._gate = open(f"{prefix}.gate", "a")  # noqa: SIM115 - held for the whole run
        self._room = open(f"{prefix}.room", "a")  # noqa: SIM115
        self.exclusive = False

    def _take(self, file: object, how: int, what: str) -> None:
        deadline = time.monotonic() + TURN_LIMIT
        while True:
            try:
                fcntl.flock(file, how | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"waited {TURN_LIMIT:g} s for {what} (tests/scheduling.py)")
                time.sleep(_POLL)

    def enter(self, alone: bool) -> None:
        """Wait for this test's turn: alone (exclusive) or beside others (shared)."""
        if alone and self.exclusive:
            return
        if self.exclusive:
            self.leave()
        self._take(self._gate, fcntl.LOCK_EX, "the turnstile")
        if alone:
            try:
                self._take(self._room, fcntl.LOCK_EX, "the other workers' tests to end")
            except BaseException:
                fcntl.flock(self._gate, fcntl.LOCK_UN)
                raise
            self.exclusive = True
            return  # the gate stays closed behind it until it leaves
        try:
            self._take(self._room, fcntl.LOCK_SH, "an alone test to end")
        finally:
            fcntl.flock(self._gate, fcntl.LOCK_UN)

    def leave(self) -> None:
        fcntl.flock(self._room, fcntl.LOCK_UN)
        if self.exclusive:
            self.exclusive = False
            fcntl.flock(self._gate, fcntl.LOCK_UN)


_turnstile: Turnstile | None = None
_KEY = "hpccollect_turnstile"  # the workers' input naming the turnstile's folder


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: object) -> None:
    """The controller hands each worker the folder of the run's turnstile (made on first use,
    removed when the run ends)."""
    config = node.config  # type: ignore[attr-defined]
    if not hasattr(config, "_hpccollect_turnstile"):
        config._hpccollect_turnstile = tempfile.mkdtemp(prefix="hpccollect-tests-")
    node.workerinput[_KEY] = config._hpccollect_turnstile  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = getattr(config, "_hpccollect_turnstile", None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def _shared_turnstile(config: pytest.Config) -> Turnstile | None:
    """This worker's turnstile (None when the run has no workers)."""
    global _turnstile
    folder = getattr(config, "workerinput", {}).get(_KEY)
    if folder is None:
        return None
    if _turnstile is None:
        _turnstile = Turnstile(Path(folder) / "turn")
    return _turnstile


def _alone(item: pytest.Item | None) -> bool:
    return item is not None and item.get_closest_marker("alone") is not None


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Run ``item`` in its turn; outside pytest-timeout's timer, which starts once it has it."""
    turnstile = _shared_turnstile(item.config)
    if turnstile is None:
        yield
        return
    turnstile.enter(_alone(item))
    try:
        yield
    finally:
        # an alone test followed by another keeps the room; the next test's enter() decides
        if not (_alone(item) and _alone(nextitem)):
            turnstile.leave()


@pytest.hookimpl(tryfirst=True)  # before xdist names each test's group
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group the tests of each machine-wide resource and the ``alone`` tests, and hand out the
    long chains first: the ``alone`` tests, the resources' groups, the slow tests (the order is
    the same in every worker: it depends only on the collected items)."""
    for item in items:
        group = next((g for mark, g in GROUPS.items() if item.get_closest_marker(mark)), None)
        if group is None and _alone(item):
            group = "alone"
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))

    def chain(item: pytest.Item) -> int:
        if _alone(item) and item.get_closest_marker("xdist_group").args[0] == "alone":
            return 0
        if item.get_closest_marker("xdist_group") is not None:
            return 1
        return 2 if item.get_closest_marker("slow") is not None else 3

    items.sort(key=chain)


@pytest.hookimpl(tryfirst=True)  # before a worker sends its collection
def pytest_collection_finish(session: pytest.Session) -> None:
    """Refuse a worker whose groups xdist did not apply (a test of a group runs beside the rest
    of its group's tests on another worker: two clusters on the same ports and nodes)."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    for item in session.items:
        mark = item.get_closest_marker("xdist_group")
        if mark is not None and not item.nodeid.endswith(f"@{mark.args[0]}"):
            raise pytest.UsageError(
                f"pytest-xdist did not put {item.nodeid} in its group {mark.args[0]!r} (pytest "
                "9.2 with pytest-xdist 3.8 does not): install with -c constraints.txt, which "
                "keeps pytest below 9.2, or run without -n."
            )
