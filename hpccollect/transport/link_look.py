"""``LinkLook``: one look at every link of an mpi4py group, in place of a look at each link.

Rank 0 looks for the next batch many times a second. A look at one link over mpi4py is two
probes (a message, a goodbye), about 2.4 us: at 64 links a look cost 153 us, at 10,000 it
would cost 24 ms, and an idle rank 0 would spend most of a core looking. MPI answers for every
link at once: a probe for a message from any rank (``MPI_ANY_SOURCE``) names the rank whose
message comes first, and a probe for a goodbye from any rank names a rank that closed its end.
A look makes two probes for a message (the second takes what the first brought in) and, at
most every millisecond, one for a goodbye, and receives only from the ranks they name, so it
costs the same at 2 links and at 10,000.

A wait must also find the links that already hold a message (taken in by an earlier look, or
by a wait on that link alone) without walking every link: each link tells its look when its
inbox fills (``holding``), so the look keeps the few links that may hold something.

``WorkerPool`` waits through the look when all its channels share one (``Channel.look``) and they
are at least ``LinkLook.least`` (128). Below that, a look at each link costs less than about
two small batches' handling, and rank 0 waits by looking at each link (``wait_ready``, paced
as the look is: ``wait_cut.paced``): on this project's 2-core machine, where the ranks share
rank 0's cores, the look's quicker waits took rank 0 up to 20% more CPU a CartPole batch at
32 and 64 ranks (more of its waits found nothing and slept), and at 32 ranks still did with
both waits paced alike (``docs/scale.md``). A link that must be watched otherwise (its own
bell: a collector rank's link, whose weights thread wakes it) leaves the look, and waits then
look at each link again.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

from hpccollect.transport import wait_cut
from hpccollect.transport.wire import MESSAGES

__all__ = ["LinkLook"]

_GOODBYES = 1e-3  # s: how often a look asks for goodbyes (a look is a few us; this is one more)
#: each group's look while one of its links lives (``LinkLook.of``)
_LOOKS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


class LinkLook:
    """The looks of one group's links (``PolledRankChannel``s, one a peer), made as one.

    Args:
        group: the links' ``MPIGroup`` (``arrived``, ``goodbyes``).
    """

    #: the fewest links a wait goes through the look for (``WorkerPool``): where a look at each
    #: link (about 2.4 us a link) costs twice rank 0's whole handling of a small batch
    least = 128

    def __init__(self, group: Any) -> None:
        self._group = group
        #: peer -> its link, held weakly: a link holds its look, and a cycle through the links
        #: would leave the group (an MPI communicator) to the garbage collector, which may run
        #: it anywhere, even in a forked child
        self._links: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        #: the peers whose link's inbox may hold something, oldest first (a dict as an
        #: ordered set)
        self._holding: dict[int, None] = {}
        #: every link of the group is seen by this look (none left it, see ``leave``)
        self.whole = True
        self._goodbyes_due = 0.0

    @classmethod
    def of(cls, group: Any) -> LinkLook:
        """The look of ``group``'s links: the one they share while any of them lives (held
        weakly here, by the group's identity, which cannot be reused while the look holds the
        group), or a new one."""
        look = _LOOKS.get(id(group))
        if look is None:
            look = _LOOKS[id(group)] = cls(group)
        return look

    def add(self, link: Any) -> None:
        """Look at ``link`` (the group's link with ``link.peer``) from now on."""
        self._links[link.peer] = link

    def leave(self, link: Any) -> None:
        """``link`` is watched otherwise from now on (it has a bell of its own): waits over
        the group look at each link again."""
        self.whole = False

    def holding(self, link: Any) -> None:
        """``link``'s inbox got something (a message, or the news that its peer ended)."""
        self._holding[link.peer] = None

    def wait(self, timeout: float, wanted: Callable[[Any], bool]) -> list[Any]:
        """The links that ``wanted`` accepts and that hold a message or ended, within
        ``timeout`` s (maybe none); an idle wait looks again after pauses of tens of us, up to
        1 ms (``wait_cut.paced``)."""
        return wait_cut.paced(lambda: [link for link in self.look() if wanted(link)], timeout)

    def look(self) -> list[Any]:
        """Take in what came, from any link: every link that holds something now."""
        try:
            if not self._take_in():
                self._look_at_each()
        except Exception:  # the group closed under it: each link's own look tells its end
            self._look_at_each()
        holding = self._holding
        if not holding:
            return []
        found = []
        for peer in list(holding):  # a copy: another thread may add one (``lose``)
            link = self._links.get(peer)
            if link is not None and link.holds():
                found.append(link)
            else:
                holding.pop(peer, None)
        return found

    def _take_in(self) -> bool:
        """Receive each message that is here, one a link, and each goodbye (looked for at most
        every ``_GOODBYES`` s); False where the next message from any rank is one no link can
        take now (its link holds one already), which hides the messages behind it."""
        took = self._arrivals()
        if took is None:
            return False
        now = time.monotonic()
        if now >= self._goodbyes_due:
            self._goodbyes_due = now + _GOODBYES
            links = self._links
            for peer in self._group.goodbyes():  # every peer gone, whoever took its goodbye
                link = links.get(peer)
                if link is not None and not link.holds():
                    link.poll(0.0)  # what it sent before its goodbye, or its end
        # MPICH moves a message in only inside a call, and the probe that brought it in may
        # not have seen it: where nothing came, one more probe takes what the first brought
        return took > 0 or self._arrivals() is not None

    def _arrivals(self) -> int | None:
        """Receive each message that is here, one a link: how many, or None where the next is
        one its link cannot take now."""
        group, links = self._group, self._links
        took = 0
        for _ in range(len(links) + 1):  # a link holding a message ends it, at the latest
            peer = group.arrived(MESSAGES)
            if peer is None:
                break
            link = links.get(peer)
            if link is None or link.holds():
                return None
            link.poll(0.0)
            took += 1
        return took

    def _look_at_each(self) -> None:
        for link in list(self._links.values()):
            link.poll(0.0)
