"""How the suite shares this machine when it runs on several workers (``pytest -n N``,
pytest-xdist, as the README's test command does).

Most tests wait on processes they started (jobs, ranks, workers) more than they compute, so
several run side by side. Three kinds of test may not run beside just any other:

- ``alone``: a test that loads every core by itself (32 or 64 ranks). It runs with no other
  test beside it.
- ``timed``: a test that asserts how long something took (a liveness timeout, a wait's pace)
  or how little CPU an idle wait took.
  It runs beside other ``timed`` tests only: each of them mostly waits (a rank stopped, a
  timeout running out), so a few side by side leave the CPU idle enough for their timings,
  while a test of the ordinary kind (a job starting ranks) could take a core from them.
  ``tests/all.sh`` runs them first, all of them side by side, as a run of their own.
- tests of one machine-wide resource (the SLURM cluster, the simulated nodes' bridge and
  namespaces): each such resource is an ``xdist_group`` (``--dist loadgroup``), so its tests run
  one after the other on one worker, which starts the resource once. Each such test is also
  marked ``resource`` here, so that a run can leave them all out (``-m "not resource"``).

The kinds take turns in a lock shared by the workers (``Turnstile``): ordinary tests share one
room, ``timed`` tests another, and an ``alone`` test holds both. A gate in front of the rooms
lets a waiting test in before new holders of the other kind, so no kind is starved. A worker
keeps the ``alone`` turn from one ``alone`` test to the next, so a run of them is not
interleaved with the others' tests.

The groups and the ``alone`` and ``timed`` tests are handed out first: they are the suite's
longest chains, and a long chain started last would keep one worker busy after the others ran
out of work.

Test runs side by side on one machine share one turnstile where ``HPCCOLLECT_TEST_TURNSTILE``
names its folder (``tests/all.sh`` names one for all its runs).

Run without ``-n``, nothing here changes anything: the tests run one at a time.
"""

from __future__ import annotations

import fcntl
import os
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
        "alone: loads every core: no other test runs beside it under pytest -n "
        "(tests/scheduling.py)",
    )
    config.addinivalue_line(
        "markers",
        "timed: asserts how long something takes, or an idle wait's CPU: only other timed tests "
        "run beside it under pytest -n (tests/scheduling.py)",
    )
    config.addinivalue_line(
        "markers",
        "resource: uses a machine-wide resource (GROUPS: the SLURM cluster, the simulated "
        "nodes); added by tests/scheduling.py",
    )


class Turnstile:
    """The turns of the three kinds of test between the processes of a test run (or of runs
    side by side), on three ``flock``ed files: the gate, and the rooms of the ordinary and of the
    ``timed`` tests (``flock`` alone lets new holders in ahead of a waiting one). Every wait is
    bounded by ``TURN_LIMIT``."""

    def __init__(self, prefix: Path) -> None:
        self._gate = open(f"{prefix}.gate", "a")  # noqa: SIM115 - held for the whole run
        self._rooms = {
            kind: open(f"{prefix}.{kind}", "a")  # noqa: SIM115
            for kind in ("ordinary", "timed")
        }
        self._held: list[str] = []  # the rooms this worker holds
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

    def enter(self, kind: str) -> None:
        """Wait for this test's turn: ``kind`` is ``"alone"``, ``"timed"`` or ``"ordinary"``."""
        if kind == "alone" and self.exclusive:
            return
        self.leave()
        self._take(self._gate, fcntl.LOCK_EX, "the turnstile")
        try:
            for room, file in self._rooms.items():
                if room == kind:
                    continue
                # an exclusive hold waits out every holder of that room; behind the closed
                # gate no one enters it again before this test holds its own room
                self._take(file, fcntl.LOCK_EX, f"the {room} tests to end")
                if kind == "alone":
                    self._held.append(room)
                else:
                    fcntl.flock(file, fcntl.LOCK_UN)
            if kind == "alone":
                self.exclusive = True
                return  # the gate stays closed behind it until it leaves
            self._take(self._rooms[kind], fcntl.LOCK_SH, f"the {kind} room")
            self._held = [kind]
        except BaseException:
            self._release()
            fcntl.flock(self._gate, fcntl.LOCK_UN)
            raise
        fcntl.flock(self._gate, fcntl.LOCK_UN)

    def _release(self) -> None:
        for room in self._held:
            fcntl.flock(self._rooms[room], fcntl.LOCK_UN)
        self._held = []

    def leave(self) -> None:
        self._release()
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
    """This worker's turnstile (None when the run has no workers): the run's own, or the one
    in the folder ``HPCCOLLECT_TEST_TURNSTILE`` names, which test runs side by side share
    (``tests/all.sh``), so that each kind of test keeps its turn across them."""
    global _turnstile
    folder = getattr(config, "workerinput", {}).get(_KEY)
    if folder is None:
        return None
    folder = os.environ.get("HPCCOLLECT_TEST_TURNSTILE") or folder
    if _turnstile is None:
        _turnstile = Turnstile(Path(folder) / "turn")
    return _turnstile


def _alone(item: pytest.Item | None) -> bool:
    return item is not None and item.get_closest_marker("alone") is not None


def _kind(item: pytest.Item) -> str:
    if _alone(item):
        return "alone"
    return "timed" if item.get_closest_marker("timed") is not None else "ordinary"


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Run ``item`` in its turn; outside pytest-timeout's timer, which starts once it has it."""
    turnstile = _shared_turnstile(item.config)
    if turnstile is None:
        yield
        return
    turnstile.enter(_kind(item))
    try:
        yield
    finally:
        # an alone test followed by another keeps the room; the next test's enter() decides
        if not (_alone(item) and _alone(nextitem)):
            turnstile.leave()


@pytest.hookimpl(tryfirst=True)  # before xdist names each test's group, and before -m selects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group the tests of each machine-wide resource (and mark them ``resource``) and the
    ``alone`` tests, and hand out the long chains first: the ``alone`` tests, the resources'
    groups, the ``timed`` tests, the slow tests (the order is the same in every worker: it
    depends only on the collected items)."""
    for item in items:
        group = next((g for mark, g in GROUPS.items() if item.get_closest_marker(mark)), None)
        if group is not None:
            item.add_marker(pytest.mark.resource)
        elif _alone(item):
            group = "alone"
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))

    def chain(item: pytest.Item) -> int:
        if _alone(item) and item.get_closest_marker("xdist_group").args[0] == "alone":
            return 0
        if item.get_closest_marker("xdist_group") is not None:
            return 1
        if _kind(item) == "timed":
            return 2
        return 3 if item.get_closest_marker("slow") is not None else 4

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
