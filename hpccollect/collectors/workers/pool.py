"""A fixed set of workers behind ``Channel``s: requests, reply matching, deadlines, typed errors,
and a shutdown that never waits forever. Nothing here knows how messages travel or what the
workers compute.

Every wait is bounded and watches each peer's end too, so a worker that dies (an exception, a
segfault, ``kill -9``) is reported at once as a ``WorkerError`` instead of being waited on. An
exception raised in a worker is raised here with its own type (see ``remote_exception``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Collection, Sequence
from typing import Any

from hpccollect._exit import done_at_exit, shut_down_at_exit
from hpccollect.errors import (
    ArgumentTypeError,
    CollectorTimeoutError,
    WaitAbandoned,
    WorkerError,
    as_worker_error,
)
from hpccollect.protocol import Command, RemoteError, Reply, message
from hpccollect.transport.base import Channel, wait_ready

__all__ = ["WorkerPool", "remote_exception"]

_LOOK = 1.0  # s: how often a wait wakes to ask whether a peer went silent
_SILENCE_PASS = 0.1  # s: how often waits walk their workers for one that went silent


class WorkerPool:
    """Talks to one worker per channel; ``channels[i]`` is worker ``i``.

    Workers never outlive the pool: ``shutdown()`` asks them to exit and ends (``Channel.kill``)
    those that do not obey in time, and those that never answered or missed a deadline at once
    (they cannot be listening). Pools still open when the interpreter exits are shut down first
    (``hpccollect._exit``).

    Args:
        channels: one per worker.
        on_left_running: called by ``shutdown()`` with the workers it could not end (see
            ``left_running``), when there are any: whoever can end them (a launcher) hears,
            whoever shut the pool down.
    """

    def __init__(
        self,
        channels: Sequence[Channel],
        on_left_running: Callable[[list[int]], None] | None = None,
    ) -> None:
        self.channels = list(channels)
        self._index_of = {id(c): i for i, c in enumerate(self.channels)}  # a channel's worker
        self._inbox: list[deque] = [deque() for _ in self.channels]
        #: the workers whose inbox holds something, oldest first (a dict as an ordered set): a
        #: wait looks at these few, not at every worker it waits on
        self._stocked: dict[int, None] = {}
        #: replies nobody waits for: taken as they arrive (see ``defer``)
        self._deferred: list[Counter] = [Counter() for _ in self.channels]
        #: worker i has replied at least once and has not missed a deadline since
        self._responsive = [False] * len(self.channels)
        #: when waits next ask channel i whether its peer went silent
        self._next_look = [0.0] * len(self.channels)
        self._silence_due = 0.0  # when waits next walk their workers for silence
        self._closed = False
        self._abandoned: set[int] = set()  # threads whose waits end (abandon_waits_of)
        self.left_running: list[int] = []
        self._on_left_running = on_left_running
        shut_down_at_exit(self)

    def __len__(self) -> int:
        return len(self.channels)

    def abandon_waits_of(self, thread: int) -> None:
        """From now on, waits for the workers in thread ``thread`` (an ident) raise
        ``WaitAbandoned`` within ``_LOOK`` s: a background thread waiting for a batch that may
        take minutes ends, and the shutdown that follows has the channels to itself. Waits in
        other threads go on as before."""
        self._abandoned.add(thread)

    def _check_abandoned(self) -> None:
        if self._abandoned and threading.get_ident() in self._abandoned:
            raise WaitAbandoned("the collector shuts down: this wait for its workers ends")

    # ------------------------------------------------------------------ messages
    def send(self, index: int, command: Command, payload: Any = None) -> None:
        """Send one command; a worker that is gone raises ``WorkerError``."""
        channel = self.channels[index]
        if command.local_only and not channel.local:
            raise ArgumentTypeError(
                f"{command.name} passes objects that live in this machine's memory and cannot "
                f"reach worker {index} on {channel.host}; use it with local workers only."
            )
        try:
            channel.send(message(command, payload))
        except ConnectionError as err:
            raise self.death_error(index) from err

    def request(self, index: int, command: Command, payload: Any, timeout: float) -> Any:
        """Send ``command`` and return the payload of the reply it names."""
        self.send(index, command, payload)
        return self.recv(index, command.reply, timeout)

    def recv(self, index: int, expected: Reply, timeout: float) -> Any:
        """The payload of worker ``index``'s next ``expected`` reply; other replies are kept."""
        found = self._from_inbox((index,), expected)
        if found is not None:
            return found[1]
        deadline = time.monotonic() + timeout
        while True:
            self._check_silence([index])
            self._check_abandoned()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._timeout([index], expected, timeout)
            if not self.channels[index].poll(min(remaining, _LOOK)):
                continue
            got = self._receive(index)
            if got is None:
                continue
            if got[0] is expected:
                return got[1]
            self._keep(index, got)

    def defer(self, index: int, expected: Reply) -> None:
        """Worker ``index`` will send ``expected`` for a command nobody waits on: take it when
        it arrives (an error in its place is raised then, at the next wait on that worker)."""
        self._deferred[index][expected] += 1

    def wait_any(
        self, indices: Collection[int], expected: Reply, timeout: float
    ) -> tuple[int, Any]:
        """The first of ``indices`` to send ``expected``: (index, payload). A reply another
        wait took in comes first; ``indices`` is best a set, so that finding it costs the same
        at 2 and at 1,000 workers."""
        found = self._from_inbox(indices, expected)
        if found is not None:
            return found
        deadline = time.monotonic() + timeout
        while True:
            self._check_silence(indices)
            self._check_abandoned()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._timeout(list(indices), expected, timeout)
            # take from every ready worker, so a fast one cannot hide another's death or batch
            found: tuple[int, Any] | None = None
            ready = self._ready(indices, min(remaining, _LOOK))
            for channel in ready:
                index = self._index_of[id(channel)]
                try:
                    got = self._receive(index)
                except BaseException:  # a WorkerError, or a stop that cut the wait
                    if found is not None:
                        self._keep(found[0], (expected, found[1]), first=True)
                    raise
                if got is None:
                    continue
                if found is None and got[0] is expected:
                    found = (index, got[1])
                else:
                    self._keep(index, got)
            if found is not None:
                return found

    def _ready(self, indices: Collection[int], timeout: float) -> list[Channel]:
        """The channels of workers ``indices`` that ``recv`` can return from within
        ``timeout`` s (maybe none)."""
        return wait_ready([self.channels[i] for i in indices], timeout)

    def _from_inbox(self, indices: Collection[int], expected: Reply) -> tuple[int, Any] | None:
        for index in self._stocked:
            if index not in indices:
                continue
            inbox = self._inbox[index]
            for i, (kind, payload) in enumerate(inbox):
                if kind is expected:
                    del inbox[i]
                    if not inbox:
                        del self._stocked[index]
                    return index, payload
        return None

    def _keep(self, index: int, reply: tuple[Reply, Any], first: bool = False) -> None:
        """Keep a reply of worker ``index`` that nobody waits for yet (``first``: ahead of the
        others it keeps)."""
        if first:
            self._inbox[index].appendleft(reply)
        else:
            self._inbox[index].append(reply)
        self._stocked[index] = None

    def _receive(self, index: int) -> tuple[Reply, Any] | None:
        """One message from a worker known to be ready (None: a deferred reply, taken);
        errors and deaths are raised."""
        try:
            kind, payload = self.channels[index].recv()
        except ConnectionError as err:
            raise self.death_error(index) from err
        self._responsive[index] = True
        if kind is Reply.ERROR:
            raise remote_exception(payload, index, len(self), self.channels[index].rank)
        if self._deferred[index][kind] > 0:
            self._deferred[index][kind] -= 1
            return None
        return kind, payload

    def death_error(self, index: int) -> WorkerError:
        """The error for worker ``index`` whose channel failed: how it ended, if known (or
        that it went silent, which ended the channel)."""
        channel = self.channels[index]
        silence = channel.silence()
        if silence is not None:
            return self._silence_error(index, silence)
        how = channel.life.death(wait=1.0) or "closed its end of the channel"
        hint = (
            "Check the worker's memory use and the env's own logs."
            if "signal" in how
            else "Its own error is on its standard error, above; a worker that fails while it "
            "starts (an env or policy it cannot rebuild, an import) ends before it can report."
        )
        return WorkerError(
            f"{channel.describe()} {how}; collection cannot go on. {hint}",
            worker=index,
            host=channel.host,
            num_workers=len(self),
            rank=channel.rank,
        )

    def _check_silence(self, indices: Collection[int]) -> None:
        """Raise ``WorkerError`` for the first of ``indices`` whose peer went silent (see
        ``Channel.silence``); asks each at most every ``_LOOK`` s, and walks ``indices`` at
        most every ``_SILENCE_PASS`` s, whatever the waits' pace (a wait that walked 10,000
        workers would cost more than the batch it waits for)."""
        now = time.monotonic()
        if now < self._silence_due:
            return
        self._silence_due = now + _SILENCE_PASS
        looks = self._next_look
        for index in indices:
            if now < looks[index]:
                continue
            looks[index] = now + _LOOK
            why = self.channels[index].silence()
            if why is not None:
                raise self._silence_error(index, why)

    def _silence_error(self, index: int, why: str) -> WorkerError:
        self._responsive[index] = False  # it cannot be listening: end it at shutdown
        channel = self.channels[index]
        return WorkerError(
            f"{channel.describe()} {why}: its node may be down or its network cut, or the "
            "process is stopped or stuck in a call that never lets go of Python; collection "
            "cannot go on with it. Pass a larger liveness_timeout if it only pauses.",
            worker=index,
            host=channel.host,
            num_workers=len(self),
            rank=channel.rank,
        )

    def _timeout(self, indices: list[int], expected: Reply, timeout: float) -> Exception:
        for index in indices:
            self._responsive[index] = False
        which = ", ".join(self.channels[i].describe() for i in indices)
        return CollectorTimeoutError(
            f"no {expected.name} reply from {which} within {timeout:g} s; alive but "
            "busy or stuck. Pass a larger worker_timeout for slow envs or large batches."
        )

    # ------------------------------------------------------------------ shutdown
    def shutdown(self, timeout: float = 10.0, close_env: bool = True) -> None:
        """Ask every worker to exit; end those that do not within ``timeout`` s, and at once
        those that never answered or missed a deadline; idempotent."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout
        for channel, responsive in zip(self.channels, self._responsive, strict=True):
            if not responsive:
                channel.life.kill()
        asked = [False] * len(self.channels)  # SHUTDOWN reached the worker
        for i, (channel, responsive) in enumerate(
            zip(self.channels, self._responsive, strict=True)
        ):
            # one this side cannot end (a rank mpiexec started) is asked, should it come back
            if channel.life.death(wait=0.0 if responsive else 0.5) is None:
                with contextlib.suppress(Exception):
                    channel.send(message(Command.SHUTDOWN, bool(close_env)))
                    asked[i] = True
        for channel in self.channels:
            channel.life.join(deadline - time.monotonic())
        for channel in self.channels:
            channel.life.kill()
        #: workers that may still run and that this side could not end: alive, or lost and
        #: never told to stop (a failed connection tells nothing of the process), and not this
        #: side's to kill
        self.left_running = [
            i
            for i, c in enumerate(self.channels)
            if c.life.death() is None or not (self._responsive[i] or c.life.can_end or asked[i])
        ]
        for channel in self.channels:
            channel.close()
        done_at_exit(self)
        if self.left_running and self._on_left_running is not None:
            self._on_left_running(self.left_running)

    @property
    def closed(self) -> bool:
        return self._closed


def remote_exception(
    remote: RemoteError, index: int, num_workers: int, rank: int | None = None
) -> WorkerError:
    """The exception to raise for worker ``index``'s ``remote`` one: of the worker's own class
    (an hpccollect error or a builtin) and a ``WorkerError``, with the worker's host and
    traceback; a plain ``WorkerError`` when the class cannot be rebuilt here."""
    original = remote.original_class()
    cls = as_worker_error(original) if original is not None else WorkerError
    details = {
        "worker": index,
        "host": remote.host,
        "remote_traceback": remote.traceback,
        "num_workers": num_workers,
        "rank": rank,
    }
    text = f"{remote.type_name}: {remote.message}"
    try:
        err = cls(text, **details)
    except TypeError:  # the original class needs constructor arguments of its own
        err = WorkerError(text, **details)
    for name, value in remote.attrs.items():
        with contextlib.suppress(AttributeError):
            if not hasattr(WorkerError, name) and name not in details:
                setattr(err, name, value)
    return err
