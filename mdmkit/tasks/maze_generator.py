"""DFS mazes (Nolte et al. 2024, Sec. 4.1): random spanning trees of the n x n grid and their unique paths.

A maze is serialized as its tree edges (shuffled, each randomly oriented), then a start and a goal cell;
the answer is the unique start->goal path. Written in pure Python + numpy rather than on `maze-dataset`,
whose hard dependencies pull in a Jupyter stack, and so that every maze is reproducible from (seed, index).
"""

from __future__ import annotations

import hashlib
import itertools
import operator
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache, partial

import numpy as np

from mdmkit.tasks.chunks import in_chunks

Cell = int  # cells numbered row * n + col
Edge = tuple[Cell, Cell]

# Mazes drawn per item before giving up on a min_path_len that DFS trees of this size (almost) never reach.
_MAX_MAZE_DRAWS = 1000
# Largest number of mazes sent to a worker at once: small enough for a live progress bar.
_MAX_CHUNK = 2000


@dataclass(frozen=True)
class Maze:
    """One example exactly as serialized: edge order and orientation are part of the data, not noise."""

    n: int
    edges: tuple[Edge, ...]  # shuffled, each (a, b) or (b, a) at random
    start: Cell
    goal: Cell
    path: tuple[Cell, ...]  # start..goal inclusive


def _check_n(n: int) -> int:
    if operator.index(n) < 2:
        raise ValueError(f"maze side n must be >= 2, got {n}")
    return n


@cache
def _grid_neighbours(n: int) -> tuple[tuple[Cell, ...], ...]:
    """Neighbours of every cell in a fixed order, so a seeded rng always picks the same one."""
    neighbours = []
    for cell in range(n * n):
        row, col = divmod(cell, n)
        sides = ((cell - n, row > 0), (cell - 1, col > 0), (cell + 1, col < n - 1), (cell + n, row < n - 1))
        neighbours.append(tuple(m for m, inside in sides if inside))
    return tuple(neighbours)


def dfs_maze(n: int, rng: np.random.Generator) -> list[Edge]:
    """The n*n - 1 edges (a, b), a < b, of a recursive-backtracker maze grown from a random cell."""
    return _dfs_tree(n, rng)[0]


def _dfs_tree(n: int, rng: np.random.Generator) -> tuple[list[Edge], list[Cell], list[int]]:
    """dfs_maze's edges plus each cell's parent and depth in the DFS tree, which generation reuses for paths.

    Iterative (an explicit stack), so large n cannot hit Python's recursion limit. All randomness is drawn
    up front in one numpy call: per-step scalar draws would dominate the generation time.
    """
    cells = _check_n(n) * n
    neighbours = _grid_neighbours(n)
    root = int(rng.integers(cells))
    picks = rng.random(cells - 1).tolist()  # one uniform per tree edge
    parent = [-1] * cells
    depth = [-1] * cells
    parent[root], depth[root] = root, 0
    stack = [root]
    edges: list[Edge] = []
    while len(edges) < cells - 1:  # the grid is connected, so the stack never empties before this
        cell = stack[-1]
        options = [m for m in neighbours[cell] if depth[m] < 0]
        if not options:
            stack.pop()
            continue
        nxt = options[int(picks[len(edges)] * len(options))]
        parent[nxt], depth[nxt] = cell, len(stack)
        edges.append((cell, nxt) if cell < nxt else (nxt, cell))
        stack.append(nxt)
    return edges, parent, depth


def _adjacency(cells: int, edges: Iterable[Edge]) -> list[list[Cell]]:
    adjacency: list[list[Cell]] = [[] for _ in range(cells)]
    for a, b in edges:
        adjacency[a].append(b)
        adjacency[b].append(a)
    return adjacency


def _search(adjacency: list[list[Cell]], root: Cell) -> tuple[list[Cell], list[int]]:
    """Parent and depth of every cell in the tree hung from `root`; -1 for cells it does not reach."""
    parent = [-1] * len(adjacency)
    depth = [-1] * len(adjacency)
    parent[root], depth[root] = root, 0
    stack = [root]
    while stack:
        cell = stack.pop()
        for m in adjacency[cell]:
            if depth[m] < 0:
                parent[m], depth[m] = cell, depth[cell] + 1
                stack.append(m)
    return parent, depth


def _path(parent: list[Cell], depth: list[int], start: Cell, goal: Cell) -> list[Cell]:
    """start..goal in a rooted tree: both ends climb to their lowest common ancestor.

    Costs O(path length), not O(n*n), so one search per maze serves every start/goal draw.
    """
    up, down = [start], [goal]
    while depth[up[-1]] > depth[down[-1]]:
        up.append(parent[up[-1]])
    while depth[down[-1]] > depth[up[-1]]:
        down.append(parent[down[-1]])
    while up[-1] != down[-1]:
        up.append(parent[up[-1]])
        down.append(parent[down[-1]])
    return up + down[-2::-1]


def _cell(value: int, n: int, what: str) -> Cell:
    if not 0 <= operator.index(value) < n * n:
        raise ValueError(f"{what} {value} is not a cell of a {n}x{n} maze (0..{n * n - 1})")
    return int(value)


def _rooted_tree(n: int, edges: Iterable[Edge]) -> tuple[list[Cell], list[int]]:
    """`edges` as parent and depth lists rooted at cell 0; ValueError unless they are a spanning tree.

    This is the validator for maze files, so each message names what is wrong.
    """
    cells = _check_n(n) * n
    try:
        pairs = np.asarray(list(edges))
    except ValueError:  # ragged
        raise ValueError("maze edges must be (cell, cell) pairs") from None
    if pairs.shape != (cells - 1, 2):
        raise ValueError(f"a {n}x{n} maze has {cells - 1} (cell, cell) edges; got shape {pairs.shape}")
    if pairs.dtype.kind not in "iu":
        raise ValueError(f"maze edge cells must be integers, got dtype {pairs.dtype}")
    lo, hi = pairs.min(axis=1), pairs.max(axis=1)
    outside = (lo < 0) | (hi >= cells)
    if outside.any():
        raise ValueError(f"edge {tuple(pairs[outside.argmax()].tolist())} has a cell outside 0..{cells - 1}")
    step = hi - lo
    apart = ~((step == n) | ((step == 1) & (hi % n != 0)))  # (n-1, n) differ by 1 but sit on different rows
    if apart.any():
        raise ValueError(f"edge {tuple(pairs[apart.argmax()].tolist())} joins cells that are not neighbours")
    adjacency = _adjacency(cells, zip(lo.tolist(), hi.tolist()))
    # n*n - 1 edges form a spanning tree iff they connect the grid; a cycle (or repeated edge) leaves a gap.
    parent, depth = _search(adjacency, 0)
    if -1 in depth:
        unreached = depth.count(-1)
        raise ValueError(f"maze edges are not a spanning tree: a cycle leaves {unreached} cells unreached")
    return parent, depth


def maze_path(n: int, edges: Iterable[Edge], start: Cell, goal: Cell) -> list[Cell]:
    """The unique start..goal path (inclusive) of the maze; ValueError for a malformed maze or cell."""
    parent, depth = _rooted_tree(n, edges)
    return _path(parent, depth, _cell(start, n, "start"), _cell(goal, n, "goal"))


def is_valid_path(n: int, edges: Iterable[Edge], start: Cell, goal: Cell, path: Sequence[int]) -> bool:
    """Grades an answer: right endpoints, every step a maze edge, no repeated cell.

    In a tree these make it the unique path, so a correct answer need not equal a stored one. The maze
    itself is validated (ValueError if malformed): grading against a broken maze is a bug, not a wrong answer.
    """
    parent, _ = _rooted_tree(n, edges)
    cells = [operator.index(c) for c in path]
    return (
        bool(cells)
        and cells[0] == start
        and cells[-1] == goal
        and len(set(cells)) == len(cells)
        and all(0 <= c < n * n for c in cells)
        and all(parent[a] == b or parent[b] == a for a, b in itertools.pairwise(cells))  # tree edges, rooted
    )


def _random_maze(n: int, rng: np.random.Generator, min_path_len: int) -> Maze:
    cells = n * n
    for _ in range(_MAX_MAZE_DRAWS):
        tree, parent, depth = _dfs_tree(n, rng)
        # A tree path is no shorter than the grid path, so opposite corners are >= 2n - 1 cells apart.
        if min_path_len <= 2 * n - 1:
            break
        farthest = depth.index(max(depth))  # a diameter end: the farthest cell from it is the other end
        if max(_search(_adjacency(cells, tree), farthest)[1]) + 1 >= min_path_len:
            break
    else:
        raise ValueError(
            f"no {n}x{n} DFS maze has a {min_path_len}-cell path in {_MAX_MAZE_DRAWS} draws: lower it"
        )
    while True:  # terminates: this maze has a pair of cells far enough apart
        start = int(rng.integers(cells))
        goal = int(rng.integers(cells - 1))
        goal += goal >= start  # uniform over cells other than start
        path = _path(parent, depth, start, goal)
        if len(path) >= min_path_len:
            break
    order = rng.permutation(cells - 1).tolist()
    flip = (rng.random(cells - 1) < 0.5).tolist()
    edges = tuple((tree[k][1], tree[k][0]) if flip[k] else tree[k] for k in order)
    return Maze(n, edges, start, goal, tuple(path))


def _make_chunk(start: int, stop: int, *, n: int, seed: int, min_path_len: int) -> list[Maze]:
    """Mazes start..stop-1 (module level, so 'spawn' workers can unpickle it)."""
    return [_random_maze(n, np.random.default_rng([seed, i]), min_path_len) for i in range(start, stop)]


def generate_mazes(
    count: int, n: int, seed: int, min_path_len: int = 2, progress: bool = False, workers: int = 1
) -> list[Maze]:
    """`count` mazes; item i depends only on (seed, i): a larger count extends a dataset, never reshuffles it,
    and `workers` > 1 (a process pool over chunks of items) changes nothing but the time.

    Start and goal are distinct uniform cells, redrawn until the path has >= min_path_len cells (a maze with
    no such pair is redrawn). Edges are shuffled and randomly oriented so the model must learn that the
    serialization order carries no information.
    """
    _check_n(n)
    if operator.index(count) < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if not 2 <= operator.index(min_path_len) <= n * n:
        raise ValueError(f"min_path_len must be in 2..{n * n} for a {n}x{n} maze, got {min_path_len}")
    make = partial(_make_chunk, n=n, seed=seed, min_path_len=min_path_len)
    parts = in_chunks(make, count, workers, _MAX_CHUNK, f"{n}x{n} mazes", "maze", progress)
    return [maze for _, _, part in parts for maze in part]


def canonical_key(maze: Maze) -> bytes:
    """SHA-1 of the maze up to edge order and orientation (the path follows from the rest).

    Two serializations of one maze share a key, so disjoint keys prove train/val/test never share a maze.
    """
    edges = sorted((a, b) if a < b else (b, a) for a, b in maze.edges)
    fields = [maze.n, maze.start, maze.goal, *itertools.chain.from_iterable(edges)]
    return hashlib.sha1(struct.pack(f"<{len(fields)}I", *fields)).digest()
