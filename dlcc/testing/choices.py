"""The random choices behind one generated graph, recorded so that the graph can be rebuilt.

The generator (graphgen.py) asks every question through a Chooser: "which op", "which axis",
"one more node?". A fresh Chooser answers from a seeded rng and records each answer; a Chooser
made from a recorded list replays it. Editing that list and replaying it is how a failing graph
is shrunk (shrink.py): deleting a run of answers drops the nodes they built, and lowering an
answer toward 0 picks a simpler alternative, because the generator orders every alternative from
simplest to most complex and reads "no more" as 0. This is Hypothesis' choice-sequence shrinking,
which works on any generator written this way without knowing what the choices mean.

A replayed list that runs out answers 0 (the simplest choice) from then on, so any edited list
still builds a valid graph.
"""
from __future__ import annotations

import random


class Chooser:
    def __init__(self, seed: int | None = None, replay: list[int] | None = None):
        self.rng = random.Random(seed)
        self.replay = list(replay) if replay is not None else None
        self.record: list[int] = []

    def below(self, n: int) -> int:
        """An int in [0, n): 0 is the simplest answer. n ≤ 1 asks nothing (and records nothing)."""
        if n <= 1:
            return 0
        if self.replay is not None:
            i = len(self.record)
            v = self.replay[i] % n if i < len(self.replay) else 0
        else:
            v = self.rng.randrange(n)
        self.record.append(v)
        return v

    def pick(self, options):
        """One of `options`, the first being the simplest."""
        options = list(options)
        return options[self.below(len(options))]

    def between(self, lo: int, hi: int) -> int:
        """An int in [lo, hi], lo the simplest."""
        return lo + self.below(hi - lo + 1)

    def chance(self, p: float) -> bool:
        """True with probability p; False is the simpler answer (a recorded 0 means no)."""
        return self.below(1000) >= 1000 - int(round(p * 1000))

    def subset(self, items, at_least: int = 0) -> list:
        """A sub-list of `items` (in order), with at least `at_least` of them."""
        items = list(items)
        out = [x for x in items if self.chance(0.5)]
        while len(out) < min(at_least, len(items)):
            extra = [x for x in items if x not in out]
            out.append(self.pick(extra))
        return [x for x in items if x in out]

    def weighted(self, table: list[tuple[object, int]]):
        """An item of [(item, weight), ...]; the first item is the simplest."""
        total = sum(w for _, w in table)
        v = self.below(total)
        for item, w in table:
            if v < w:
                return item
            v -= w
        return table[-1][0]
