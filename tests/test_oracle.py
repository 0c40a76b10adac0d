"""The oracle floor on hand-made networks and trajectories where the answer is worked out by hand."""

from __future__ import annotations

import pytest
import torch
from fakes import DEPS, TARGET, Dependent, random_transformer

from mdmkit.samplers import ForwardCounter, Sampled, TopKSampler
from mdmkit.samplers.rules.oracle import oracle_floor, oracle_groups, oracle_merge

V, MASK = 6, 5


def reference_from(prompts: list[list[int]], targets: list[list[int]], partitions: list[list[list[int]]]) -> Sampled:
    """A hand-made reference: final tokens and each row's ordered partition of its masked positions."""
    tokens = torch.tensor(targets)
    reveal = torch.full_like(tokens, -1)
    for row, partition in enumerate(partitions):
        for step, positions in enumerate(partition):
            reveal[row, positions] = step
        assert sorted(p for s in partition for p in s) == [i for i, t in enumerate(prompts[row]) if t == MASK]
    return Sampled(tokens, reveal, torch.tensor([len(p) for p in partitions]))


# Dependent(target, deps): position i predicts target[i] once all of deps[i] is revealed (V tokens, MASK the
# last); records the batch size of every call. TARGET, DEPS: 3, 1, 6 are always right; 5 needs 3; 2 needs 5;
# 4 needs 2.
M = MASK


def test_hand_made_floor_with_the_order_constraint() -> None:
    # row 0: pass 1 reveals step 0 ({3}); step 1 holds 5 (wrong, 3 hidden) -> stop.
    #        pass 2 reveals step 1 ({1, 5}); step 2 ({2}) is wrong (5 hidden) -> stop, although step 3 ({6})
    #        is already right: the order constraint keeps it back.
    #        pass 3 reveals step 2 and merges step 3 ({6}, right); step 4 ({4}) needs 2 -> stop.
    #        pass 4 reveals step 4. Floor 4 of 5 steps.
    # row 1: step 0 {3}, step 1 {1, 6} right at the prompt -> merged; step 2 {5}; step 3 {2}; step 4 {4}: 4 of 5.
    # row 2: everything given but 5 and 4; step 0 {5} (3 is given, so right), step 1 {4} needs 2, given -> 1.
    # row 3: nothing to reveal: 0 passes.
    prompts = [[1, M, M, M, M, M, M], [1, M, M, M, M, M, M], [1, 2, 3, 4, M, M, 3], TARGET]
    partitions = [
        [[3], [1, 5], [2], [6], [4]],
        [[3], [1, 6], [5], [2], [4]],
        [[5], [4]],
        [],
    ]
    reference = reference_from(prompts, [TARGET] * 4, partitions)
    net = Dependent(TARGET, DEPS)
    merge = oracle_merge(net, torch.tensor(prompts), reference, MASK)
    assert merge.nfe.tolist() == [4, 4, 1, 0]
    assert merge.groups(0) == [[0], [1], [2, 3], [4]]
    assert merge.groups(1) == [[0, 1], [2], [3], [4]]
    assert merge.groups(2) == [[0, 1]]
    assert merge.groups(3) == []
    assert net.calls == [3, 2, 2, 2]  # finished rows leave the batch; the empty row never runs
    assert oracle_groups(net, torch.tensor(prompts), reference, MASK, row=0) == [[0], [1], [2, 3], [4]]
    for batch_size in (1, 2, None):
        assert oracle_floor(net, torch.tensor(prompts), reference, MASK, batch_size).tolist() == [4, 4, 1, 0]


PARTITIONS = [
    [[0], [7], [3, 4], [1], [2, 5, 6]],
    [[2, 3], [0], [1], [5], [4, 6], [7]],
    [[6], [1], [0, 2, 3, 4, 5, 7]],
]
FINAL = [3, 1, 4, 1, 0, 2, 2, 3]


def test_a_model_that_knows_the_answer_needs_one_pass_and_ignores_the_mask_logit() -> None:
    prompts = torch.full((3, 8), MASK)
    reference = reference_from(prompts.tolist(), [FINAL] * 3, PARTITIONS)
    for net in (Dependent(FINAL, {}), Dependent(FINAL, {}, mask_bias=True)):
        assert oracle_floor(net, prompts, reference, MASK).tolist() == [1, 1, 1]


@pytest.mark.parametrize("row", range(3))
def test_a_model_right_only_about_the_next_step_needs_every_step(row: int) -> None:
    partition = PARTITIONS[row]
    deps = {p: [q for earlier in partition[:s] for q in earlier] for s, step in enumerate(partition) for p in step}
    prompts = torch.full((2, 8), MASK)  # the same row twice: batching must not change anything
    reference = reference_from(prompts.tolist(), [FINAL] * 2, [partition] * 2)
    merge = oracle_merge(Dependent(FINAL, deps), prompts, reference, MASK)
    assert merge.nfe.tolist() == [len(partition)] * 2
    assert merge.groups(1) == [[s] for s in range(len(partition))]


def test_an_inconsistent_reference_is_rejected() -> None:
    prompts = torch.tensor([[1, M, M, M, M, M, M]])
    reference = reference_from(prompts.tolist(), [TARGET], [[[3], [1, 2, 4, 5, 6]]])
    reference.tokens[0, 0] = 2
    with pytest.raises(ValueError, match="changes a given prompt token"):
        oracle_floor(Dependent(TARGET, {}), prompts, reference, MASK)


def replay(net: torch.nn.Module, prompt: torch.Tensor, reference: Sampled, row: int,
           groups: list[list[int]]) -> torch.Tensor:
    """Reveal each merged group's positions with the network's argmax at that pass (one pass per group)."""
    state = prompt.clone()
    for group in groups:
        logits = net(state[None])[0].float()
        logits[:, MASK] = float("-inf")
        reveal = torch.isin(reference.reveal_step[row], torch.tensor(group))
        state = torch.where(reveal, logits.argmax(-1), state)
    return state


def test_on_a_real_network_the_merged_schedule_reproduces_the_reference() -> None:
    L, B = 10, 6
    net = random_transformer(V, L)
    prompts = torch.randint(0, 5, (B, L))
    for row in range(B):
        prompts[row, torch.randperm(L)[: row + 4]] = MASK
    counter = ForwardCounter(net, B)
    reference = TopKSampler(k=1).sample(counter, prompts, MASK)
    floor = oracle_floor(net, prompts, reference, MASK)
    assert ((floor >= 1) & (floor <= reference.steps)).all()
    assert floor.sum() < counter.nfe.sum()  # some merging happens: the test is not trivial
    assert torch.equal(oracle_floor(net, prompts, reference, MASK, batch_size=4), floor)
    for row in range(B):
        groups = oracle_groups(net, prompts, reference, MASK, row)
        assert len(groups) == floor[row]
        assert sorted(s for g in groups for s in g) == list(range(int(reference.steps[row])))
        assert torch.equal(replay(net, prompts[row], reference, row, groups), reference.tokens[row])
