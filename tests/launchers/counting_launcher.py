"""A launcher written outside hpccollect, as a user would add one: the local launcher, counting
the ranks it starts (registered by the test that uses it)."""

from __future__ import annotations

from hpccollect.launchers import MPLauncher

STARTED: list[int] = []


class CountingLauncher(MPLauncher):
    def start(self, ranks):
        STARTED.append(len(ranks))
        return super().start(ranks)
