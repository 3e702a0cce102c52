"""Dynamic program over the chain of stages (after Rotor, Herrmann et al. 2019), with the
per-stage ILP options as its menu (as in Rockmate).

`best[s][t][m]`: the least time to run the backward of stages s..t, starting with the input
frontier F_{s-1} kept (charged outside m) and the gradient G_t alive, producing G_{s-1}, never
using more than m memory units. Two ways to start:

- keep-all first: run stage s's forward keeping option o's tensors, solve s+1..t with F_s
  held as their checkpoint, then run stage s's backward under option o;
- checkpoint: run stages s..j-1 forward keeping nothing, solve j..t with F_{j-1} held as
  their checkpoint, then solve s..j-1 again from F_{s-1}.

The first descent of the optimal recursion is the training step's forward pass (every stage
runs forward exactly once before the first backward), so the memory it keeps is what our
forward saves. Memory is counted conservatively (rounded up, shared tensors counted on each
side); the compiled program's exact simulation is what the solver finally checks and reports.
Arrays are vectors over m, so a table for every budget costs one pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from explorer.chain import Chain
from explorer.stage_ilp import StageOption

INF = float("inf")


@dataclass
class StageCosts:
    """What the dynamic program needs to know about one stage, in memory units."""

    x: int  # F_i bytes
    g: int  # G_i bytes
    forward_peak: int  # stage forward's own tensors at their peak (its inputs excluded)
    forward_seconds: float
    backward_seconds: float
    param_grads: int
    options: list[StageOption]


@dataclass
class Step:
    """One item of the solved sequence."""

    kind: str  # "forward" (keep nothing), "forward_keep" (option o), "backward" (option o)
    stage: int
    option: int = -1


class ChainTable:
    """The solved table for all budgets up to `units * unit_bytes`."""

    def __init__(
        self, costs: list[StageCosts], fresh_bytes: list[list[int]], unit_bytes: int, units: int
    ) -> None:
        self.costs = costs
        self.unit = unit_bytes
        self.units = units
        k = len(costs)
        u = self._u
        self.best = np.full((k, k, units + 1), INF, dtype=np.float64)
        self.choice = np.full((k, k, units + 1), -1, dtype=np.int32)
        self._prefix = np.concatenate([[0.0], np.cumsum([c.forward_seconds for c in costs])])
        self._pg = np.concatenate([[0], np.cumsum([c.param_grads for c in costs])])
        self._x = np.array([u(c.x) for c in costs], dtype=np.int64)
        # fresh[s, j]: units of F_{j-1} not already in F_{s-1} (those are held by the caller)
        self._fresh = np.array([[u(b) for b in row] for row in fresh_bytes], dtype=np.int64)
        self._fpeak = np.array([u(c.forward_peak) for c in costs], dtype=np.int64)
        self._m = np.arange(units + 1)
        for length in range(k):
            for s in range(k - length):
                self._fill(s, s + length)

    def _u(self, nbytes: float) -> int:
        """Bytes to memory units, rounded up (the table never under-counts)."""
        return int(-(-int(nbytes) // self.unit))

    def _shift(self, arr: np.ndarray, d: int) -> np.ndarray:
        out = np.full(self.units + 1, INF)
        if d <= self.units:
            out[d:] = arr[: self.units + 1 - d]
        return out

    def _shift_rows(self, rows: np.ndarray, shifts: np.ndarray) -> np.ndarray:
        """Row r shifted right by shifts[r] (inf where nothing shifts in)."""
        idx = self._m[None, :] - shifts[:, None]
        out = np.take_along_axis(rows, np.clip(idx, 0, self.units), axis=1)
        out[idx < 0] = INF
        return out

    def _held(self, s: int, opt: StageOption) -> int:
        """Units held while stages s+1.. run after stage s kept `opt`: its kept tensors and the
        new part of F_s, a tensor that is both counted once. Filling and reading the table
        must use the same figure, so it is computed here only."""
        return self._u(opt.keep_bytes) + int(self._fresh[s, s + 1]) - self._u(opt.output_bytes)

    def _pg_units(self, lo: int, hi: int) -> int:
        """Parameter-gradient units made by stages lo..hi (inclusive)."""
        return self._u(self._pg[hi + 1] - self._pg[lo]) if hi >= lo else 0

    def _fill(self, s: int, t: int) -> None:
        u, c = self._u, self.costs
        best = np.full(self.units + 1, INF)
        choice = np.full(self.units + 1, -1, dtype=np.int32)
        g_t = u(c[t].g)
        for o, opt in enumerate(c[s].options):
            keep, bpeak = u(opt.keep_bytes), u(opt.peak_bytes)
            cost = c[s].forward_seconds + c[s].backward_seconds + opt.redo_seconds
            first = g_t + keep + self._fpeak[s]
            if s == t:
                total = np.where(self._m >= max(first, bpeak), cost, INF)
            else:
                rest = self._shift(self.best[s + 1, t], self._held(s, opt))
                fits = self._m >= max(first, bpeak + self._pg_units(s + 1, t))
                total = np.where(fits, cost + rest, INF)
            better = total < best
            best[better], choice[better] = total[better], o
        if s < t:
            self._checkpoint_starts(s, t, g_t, best, choice)
        self.best[s, t], self.choice[s, t] = best, choice

    def _checkpoint_starts(self, s, t, g_t, best, choice) -> None:
        """Every split j in s+1..t at once: forward s..j-1 keeping nothing, solve j..t from
        F_{j-1}, then s..j-1 again from F_{s-1}."""
        js = np.arange(s + 1, t + 1)
        inputs = np.concatenate([[0], self._x[s : t - 1]])  # F_{k-1} alive while k runs, k > s
        sweep_peak = np.maximum.accumulate(inputs + self._fpeak[s:t])
        grads_after = -(-(self._pg[t + 1] - self._pg[js]) // self.unit)  # units, rounded up
        later = self._shift_rows(self.best[js, t], self._fresh[s, js])
        again = self._shift_rows(self.best[s, js - 1], grads_after)
        forward = (self._prefix[js] - self._prefix[s])[:, None]
        total = forward + later + again
        total[self._m[None, :] < (g_t + sweep_peak)[:, None]] = INF
        pick = np.argmin(total, axis=0)
        value = total[pick, self._m]
        better = value < best
        best[better] = value[better]
        choice[better] = len(self.costs[s].options) + js[pick[better]]

    def min_units(self) -> int | None:
        """The fewest memory units with which the whole chain can be run, if any."""
        feasible = np.nonzero(np.isfinite(self.best[0, len(self.costs) - 1]))[0]
        return int(feasible[0]) if len(feasible) else None

    def sequence(self, m: int) -> list[Step]:
        """The optimal sequence of stage steps with `m` memory units."""
        steps: list[Step] = []
        self._emit(0, len(self.costs) - 1, min(m, self.units), steps)
        return steps

    def _emit(self, s: int, t: int, m: int, steps: list[Step]) -> None:
        c = self.costs
        code = int(self.choice[s, t, m])
        if code < 0:
            raise ValueError("no schedule fits this memory")
        n_opt = len(c[s].options)
        if code < n_opt:
            opt = c[s].options[code]
            steps.append(Step("forward_keep", s, code))
            if s < t:
                self._emit(s + 1, t, m - self._held(s, opt), steps)
            steps.append(Step("backward", s, code))
            return
        j = code - n_opt
        steps.extend(Step("forward", k) for k in range(s, j))
        self._emit(j, t, m - int(self._fresh[s, j]), steps)
        self._emit(s, j - 1, m - self._pg_units(j, t), steps)


def stage_costs(chain: Chain, options: list[list[StageOption]]) -> list[StageCosts]:
    """Sizes and times of every stage, for the table."""
    costs = []
    for stage, opts in zip(chain.stages, options, strict=True):
        costs.append(
            StageCosts(
                x=chain.bytes_of(stage.outputs),
                g=chain.bytes_of(stage.grad_inputs),
                forward_peak=_forward_peak(chain, stage.index),
                forward_seconds=stage.forward_seconds,
                backward_seconds=stage.backward_seconds,
                param_grads=stage.param_grad_bytes,
                options=opts,
            )
        )
    return costs


def fresh_frontier_bytes(chain: Chain) -> list[list[int]]:
    """fresh[s][j] = bytes of F_{j-1} that are not in F_{s-1} (for s < j; 0 elsewhere).

    A checkpoint at F_{j-1} taken while F_{s-1} is held only costs what is new: tensors that
    a skip connection carries across several stages are paid for once."""
    k = len(chain.stages)
    frontiers = [set()] + [set(stage.outputs) for stage in chain.stages]  # frontiers[i] = F_{i-1}
    fresh = [[0] * (k + 1) for _ in range(k)]
    for s in range(k):
        for j in range(s + 1, k + 1):
            fresh[s][j] = chain.bytes_of(sorted(frontiers[j] - frontiers[s]))
    return fresh


def _forward_peak(chain: Chain, index: int) -> int:
    """Peak bytes of a stage's own tensors while its forward runs (inputs not counted)."""
    graph = chain.graph
    stage = chain.stages[index]
    outputs = set(stage.outputs)
    last_read: dict = {}
    for k, name in enumerate(stage.forward):
        for ref in graph.node(name).inputs:
            last_read[chain.owner.get(ref, ref)] = k
    alive: dict = {}
    peak = 0
    for k, name in enumerate(stage.forward):
        node = graph.node(name)
        for i, meta in enumerate(node.outputs):
            if meta is not None and meta.alias_of is None:
                alive[(name, i)] = meta.nbytes
        peak = max(peak, sum(alive.values()))
        for ref in list(alive):
            if ref in outputs or any(chain.owner.get(o) == ref for o in outputs):
                continue
            if last_read.get(ref, -1) <= k:
                del alive[ref]
    return peak
