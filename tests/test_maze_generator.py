"""DFS maze generator: mazes are spanning trees, paths are unique and checked, datasets are reproducible."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from mdmkit.tasks.maze_generator import (
    Maze,
    canonical_key,
    dfs_maze,
    generate_mazes,
    is_valid_path,
    maze_path,
)


def grid_adjacent(n: int, a: int, b: int) -> bool:
    (ra, ca), (rb, cb) = divmod(a, n), divmod(b, n)
    return abs(ra - rb) + abs(ca - cb) == 1


def connected(n: int, edges) -> bool:
    adjacency = {c: set() for c in range(n * n)}
    for a, b in edges:
        adjacency[a].add(b)
        adjacency[b].add(a)
    seen, stack = {0}, [0]
    while stack:
        for m in adjacency[stack.pop()] - seen:
            seen.add(m)
            stack.append(m)
    return len(seen) == n * n


def all_simple_paths(edges, start: int, goal: int) -> list[list[int]]:
    """Brute force: every cycle-free walk start..goal, with no assumption that the graph is a tree."""
    links = {frozenset(e) for e in edges}
    found, stack = [], [[start]]
    while stack:
        path = stack.pop()
        if path[-1] == goal:
            found.append(path)
            continue
        for link in links:
            if path[-1] in link:
                (m,) = link - {path[-1]}
                if m not in path:
                    stack.append([*path, m])
    return found


@pytest.mark.parametrize("n", [2, 3, 5, 10, 32])
def test_dfs_maze_is_a_spanning_tree(n: int) -> None:
    for seed in range(5):
        edges = dfs_maze(n, np.random.default_rng(seed))
        assert len(edges) == n * n - 1 == len(set(edges))
        assert all(a < b and grid_adjacent(n, a, b) for a, b in edges)
        assert connected(n, edges)


def test_dfs_maze_reaches_every_spanning_tree_of_the_2x2_grid() -> None:
    trees = {frozenset(dfs_maze(2, np.random.default_rng(seed))) for seed in range(200)}
    assert len(trees) == 4  # the 4-cycle minus any one of its edges


def test_maze_path_matches_brute_force() -> None:
    n = 3
    edges = dfs_maze(n, np.random.default_rng(7))
    for start in range(n * n):
        for goal in range(n * n):
            assert all_simple_paths(edges, start, goal) == [maze_path(n, edges, start, goal)]


@pytest.mark.parametrize("n", [4, 8])
def test_maze_path_is_valid(n: int) -> None:
    rng = np.random.default_rng(n)
    for _ in range(20):
        edges = dfs_maze(n, rng)
        start, goal = rng.integers(n * n, size=2).tolist()
        path = maze_path(n, edges, start, goal)
        assert is_valid_path(n, edges, start, goal, path)
        assert is_valid_path(n, [(b, a) for a, b in reversed(edges)], start, goal, np.array(path))


def test_is_valid_path_rejects_bad_paths() -> None:
    # 3x3 snake: 0-1-2, 2-5, 5-4-3, 3-6, 6-7-8
    edges = [(0, 1), (1, 2), (2, 5), (4, 5), (3, 4), (3, 6), (6, 7), (7, 8)]
    assert maze_path(3, edges, 0, 4) == [0, 1, 2, 5, 4]
    assert is_valid_path(3, edges, 0, 4, [0, 1, 2, 5, 4])
    assert not is_valid_path(3, edges, 0, 4, [0, 3, 4])  # grid-adjacent steps, but 0-3 is a wall
    assert not is_valid_path(3, edges, 0, 4, [0, 1, 0, 1, 2, 5, 4])  # every step an edge, cells repeat
    assert not is_valid_path(3, edges, 0, 4, [1, 2, 5, 4])  # wrong start
    assert not is_valid_path(3, edges, 0, 4, [0, 1, 2, 5])  # wrong goal
    assert not is_valid_path(3, edges, 0, 4, [])
    assert not is_valid_path(3, edges, 0, 4, [0, 1, 2, 5, 4, 99, 4])  # out-of-range cell


def test_generate_mazes_is_deterministic_and_prefix_stable() -> None:
    mazes = generate_mazes(10, 5, seed=3)
    assert mazes == generate_mazes(10, 5, seed=3)
    assert mazes[:5] == generate_mazes(5, 5, seed=3)
    assert mazes != generate_mazes(10, 5, seed=4)
    assert generate_mazes(0, 5, seed=3) == []
    assert generate_mazes(3, 5, seed=3, progress=True) == mazes[:3]


def test_worker_processes_change_nothing_but_the_time() -> None:
    mazes = generate_mazes(40, 4, seed=7)
    assert generate_mazes(40, 4, seed=7, workers=3) == mazes  # chunks over a pool, reassembled in order
    with pytest.raises(ValueError, match="workers must be >= 1"):
        generate_mazes(4, 4, seed=7, workers=0)


def test_generated_mazes_are_shuffled_trees_with_their_paths() -> None:
    n = 6
    mazes = generate_mazes(50, n, seed=0)
    for maze in mazes:
        assert maze.n == n and maze.start != maze.goal
        assert all(isinstance(c, int) for edge in maze.edges for c in edge)
        normalized = sorted(tuple(sorted(e)) for e in maze.edges)
        assert connected(n, normalized) and all(grid_adjacent(n, a, b) for a, b in normalized)
        assert list(maze.path) == maze_path(n, maze.edges, maze.start, maze.goal)
        assert is_valid_path(n, maze.edges, maze.start, maze.goal, maze.path)
    # serialization order and orientation vary: both orientations occur, and order is not sorted
    assert any(a > b for m in mazes for a, b in m.edges) and any(a < b for m in mazes for a, b in m.edges)
    assert sum(list(m.edges) != sorted(m.edges) for m in mazes) == len(mazes)
    assert len({m.start for m in mazes}) > 10 and len({m.goal for m in mazes}) > 10


def test_canonical_key_ignores_serialization_only() -> None:
    maze = generate_mazes(1, 5, seed=1)[0]
    rng = np.random.default_rng(0)
    for _ in range(5):
        order = rng.permutation(len(maze.edges))
        edges = tuple(maze.edges[i][:: rng.choice([1, -1])] for i in order)
        assert canonical_key(dataclasses.replace(maze, edges=edges)) == canonical_key(maze)
    assert canonical_key(dataclasses.replace(maze, goal=maze.start, start=maze.goal)) != canonical_key(maze)
    keys = {canonical_key(m) for m in generate_mazes(200, 5, seed=1)}
    assert len(keys) == 200


@pytest.mark.parametrize(
    "edges, message",
    [
        ([(0, 1), (1, 2), (2, 5), (4, 5), (3, 4), (3, 6), (6, 7)], "8 .* edges"),  # too few
        ([(0, 1), (1, 2), (2, 5), (4, 5), (3, 4), (3, 6), (6, 7), (7, 8), (0, 3)], "8 .* edges"),  # too many
        ([(0, 1), (1, 2), (2, 3), (4, 5), (3, 4), (3, 6), (6, 7), (7, 8)], "not neighbours"),  # 2-3 wraps
        ([(0, 1), (1, 2), (2, 5), (4, 5), (3, 4), (3, 6), (6, 7), (0, 4)], "not neighbours"),  # diagonal
        ([(0, 1), (1, 2), (2, 5), (4, 5), (3, 4), (3, 6), (6, 7), (8, 9)], "outside"),
        ([(0, 1), (1, 2), (2, 5), (4, 5), (3, 4), (3, 0), (6, 7), (7, 8)], "spanning tree"),  # cycle
        ([(0, 1), (1, 2), (2, 5), (4, 5), (3, 4), (3, 6), (6, 7), (6, 7)], "spanning tree"),  # repeated edge
        ([(0, 1), (1, 2), (2, 5), (4, 5), (3, 4), (3, 6), (6, 7), (7, 8, 5)], "pairs"),
        ([(0, 1), (1, 2), (2, 5), (4, 5), (3, 4), (3, 6), (6, 7), (7.0, 8.0)], "integers"),
    ],
)
def test_malformed_edges_raise(edges, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        maze_path(3, edges, 0, 8)
    with pytest.raises(ValueError, match=message):
        is_valid_path(3, edges, 0, 8, [0, 8])


def test_maze_path_rejects_bad_cells() -> None:
    edges = dfs_maze(3, np.random.default_rng(0))
    with pytest.raises(ValueError, match="start"):
        maze_path(3, edges, -1, 4)
    with pytest.raises(ValueError, match="goal"):
        maze_path(3, edges, 0, 9)


def test_min_path_len_is_respected() -> None:
    assert all(len(m.path) >= 12 for m in generate_mazes(30, 5, seed=2, min_path_len=12))
    assert all(len(m.path) == 4 for m in generate_mazes(10, 2, seed=2, min_path_len=4))  # 2x2 trees are paths
    with pytest.raises(ValueError, match="lower it"):  # no 10x10 DFS tree in thousands is a Hamiltonian path
        generate_mazes(1, 10, seed=0, min_path_len=100)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"count": 1, "n": 1, "seed": 0}, "n must be >= 2"),
        ({"count": -1, "n": 3, "seed": 0}, "count"),
        ({"count": 1, "n": 3, "seed": 0, "min_path_len": 1}, "min_path_len"),
        ({"count": 1, "n": 3, "seed": 0, "min_path_len": 10}, "min_path_len"),
    ],
)
def test_generate_mazes_validates_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        generate_mazes(**kwargs)


def test_maze_is_frozen() -> None:
    maze = generate_mazes(1, 3, seed=0)[0]
    assert isinstance(maze, Maze)
    with pytest.raises(dataclasses.FrozenInstanceError):
        maze.start = 0  # type: ignore[misc]


def test_asking_for_more_mazes_than_exist_stops_early_naming_n_train(tmp_path):
    from mdmkit.core.errors import ConfigError
    from mdmkit.tasks.maze import MazeTask

    task = MazeTask(grid_size=3, n_train=10_000, cache_dir=str(tmp_path))  # 3x3 mazes: ~6.3k distinct examples
    with pytest.raises(ConfigError, match=r"found \d+ distinct examples of the 12000 asked for .*lower task.n_train"):
        task._generate_unique(12_000)
