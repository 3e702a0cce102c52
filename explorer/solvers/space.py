"""The schedule space every solver here searches, and the way a point of it becomes a GraphSchedule.

The forward runs every forward operator once, in traced order. The backward operators run in
one fixed order, the chain's (stages from last to first, each stage's operators in traced
order). Before each backward operator that reads a forward tensor comes a window: the forward
operators it runs again, in forward order. A point of the space is the list of windows.

Windows hold only operators that allocate. A view (detach, transpose, reshape...) allocates
nothing and costs microseconds, so `lower` makes one again right before whatever reads it
whenever the tensor it views was made again since (or the view itself was freed), instead of
deciding about it: a view is available exactly when the storage it views is. `lower` turns
windows into a GraphSchedule whose saved set is what the backward reads before making it again;
`windows_of` projects any GraphSchedule of the same backward order back onto the space.
"""

from __future__ import annotations

from explorer.graph import BACKWARD, EFFECT, FORWARD, Graph, Node, ValueRef, storage_owners
from explorer.program import read_before_made
from explorer.schedule import GraphSchedule

Windows = list[list[str]]


def backward_order(graph: Graph, stages: list[list[str]]) -> list[str]:
    """The backward operators of `stages` (each stage's list, first stage first) from the
    last stage to the first; any operator no stage holds comes last."""
    order = [name for stage in reversed(stages) for name in stage]
    placed = set(order)
    return order + [n.name for n in graph.nodes if n.phase == BACKWARD and n.name not in placed]


def is_view_op(node: Node) -> bool:
    """An operator whose every tensor output shares an input's storage."""
    metas = [m for m in node.outputs if m is not None]
    return bool(metas) and all(m.alias_of is not None for m in metas)


class Space:
    """The space for one graph and one backward order (see module docstring)."""

    def __init__(self, graph: Graph, order: list[str], pinned: set[str]) -> None:
        self.graph = graph
        self.order = order
        self.pinned = pinned  # forward operators never run again (random draws, model outputs)
        self.outputs = {r for r in graph.model_outputs if r is not None}
        forward = [n for n in graph.nodes if n.phase in (FORWARD, EFFECT)]
        self.position = {n.name: p for p, n in enumerate(forward)}
        self.views = {n.name for n in forward if n.phase == FORWARD and is_view_op(n)}
        self.decisions = [
            n.name
            for n in forward
            if n.phase == FORWARD and n.name not in pinned and n.name not in self.views
        ]
        self.owner = storage_owners(graph)
        # storages that hold a model output stay alive all step: reading them needs nothing
        self.held = {self.owner.get(r, r) for r in self.outputs}
        self.reading = [bool(self.storage_reads(name)) for name in order]

    def storage_reads(self, name: str) -> list[ValueRef]:
        """The forward-made storages (by their root value) behind the forward values that
        operator `name` reads, except those held all step. (A backward view of a forward
        storage keeps it allocated by itself: reading the view needs nothing more.)"""
        found: list[ValueRef] = []
        for r in self.graph.node(name).inputs:
            root = self.owner.get(r, r)
            if r[0] not in self.position or root[0] not in self.position:
                continue
            if root not in self.held and root not in found:
                found.append(root)
        return found

    def empty(self) -> Windows:
        return [[] for _ in self.order]

    def everything(self) -> Windows:
        """Every stage that reads a forward tensor runs again all it needs from what the
        forward must keep (inputs, pinned draws, outputs): the space's extreme in what the
        forward saves (Checkmate's "recompute all"), and the least peak of some steps
        (gpt_2_layers', sample:unet's at 32 px) that the chain table's schedules miss."""
        return self.prune([list(self.decisions) if reads else [] for reads in self.reading])

    # -- windows -> schedule -----------------------------------------------------------------

    def lower(self, windows: Windows, fingerprint: str) -> GraphSchedule:
        """The schedule that runs window t (with the views its readers need), then backward
        operator t, for every t."""
        graph = self.graph
        sequence: list[str] = []
        stale: set[ValueRef] = set()  # views whose storage was made again since they were

        def ensure(ref: ValueRef) -> None:
            maker = ref[0]
            if ref in stale and maker in self.views and maker not in self.pinned:
                for r in graph.node(maker).inputs:
                    ensure(r)
                sequence.append(maker)
                stale.difference_update((maker, i) for i in range(len(graph.node(maker).outputs)))

        for window, name in zip(windows, self.order, strict=True):
            for a in window:
                node = graph.node(a)
                for r in node.inputs:
                    ensure(r)
                sequence.append(a)
                roots = {(a, i) for i, m in enumerate(node.outputs) if m is not None}
                stale.update(v for v, root in self.owner.items() if root in roots)
            for r in graph.node(name).inputs:
                ensure(r)
            sequence.append(name)
        saved = read_before_made(graph, sequence, self.position)  # forward and effects
        return GraphSchedule(fingerprint, saved, sequence)

    # -- schedule -> windows -----------------------------------------------------------------

    def windows_of(self, schedule: GraphSchedule) -> Windows | None:
        """The windows of a schedule with this backward order: its allocating recomputations,
        each moved to the next backward operator that reads a forward tensor. None if the
        schedule has another backward order."""
        windows = self.empty()
        pending: list[str] = []
        t = 0
        for name in schedule.backward:
            if name in self.position:
                if name not in self.views:
                    pending.append(name)
                continue
            if t >= len(self.order) or self.order[t] != name:
                return None
            if self.reading[t]:
                windows[t] = sorted(set(pending), key=self.position.__getitem__)
                pending = []
            t += 1
        if t != len(self.order):
            return None
        return windows

    def prune(self, windows: Windows) -> Windows:
        """Drop recomputations whose outputs nothing reads before they are made again: they
        cost time and memory for nothing (an answer may carry some that cost nothing in its
        solver's objective)."""
        graph = self.graph
        wanted: set[ValueRef] = set()
        kept: Windows = self.empty()

        def want(name: str) -> None:  # inputs, through the views `lower` will remake
            for r in graph.node(name).inputs:
                root = self.owner.get(r, r)
                wanted.add(root if r[0] in self.views else r)

        for t in reversed(range(len(self.order))):
            node = graph.node(self.order[t])
            wanted.difference_update((self.order[t], i) for i in range(len(node.outputs)))
            want(self.order[t])
            for name in reversed(windows[t]):
                outs = {(name, i) for i in range(len(graph.node(name).outputs))}
                if outs & wanted:
                    kept[t].append(name)
                    wanted.difference_update(outs)
                    want(name)
            kept[t].reverse()
        return kept


def saved_by_liveness(graph: Graph, sequence: list[str]) -> list[ValueRef]:
    """Forward values (BatchNorm's effects included) the backward reads before (or without)
    making them again."""
    forward = {n.name for n in graph.nodes if n.phase in (FORWARD, EFFECT)}
    return read_before_made(graph, sequence, forward)
