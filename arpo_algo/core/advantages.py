"""Advantages: GRPO and REINFORCE++ estimators, and ARPO's soft and hard attribution over a rollout tree.

Estimators turn the rewards of a batch of groups (``[groups, M]``) into one advantage per trajectory:

* `grpo_advantages` — each reward minus its group's mean, divided by the group's standard deviation (``scale=
  "group"``, TRL's default), by the batch's (``"batch"``), or not at all (``"none"``, Dr. GRPO);
* `reinforce_pp_advantages` — REINFORCE++: the reward minus the batch mean, divided by the batch standard
  deviation (a global baseline rather than a per-group one).

Attribution decides what the tokens that several trajectories share (the prefix before a branch point) receive:

* soft — every trajectory is an ordinary sequence with its own advantage; a shared token appears in each of the
  trajectories below it and so enters the loss once per descendant, with each descendant's advantage (plain GRPO
  over the M sequences; what the reference implementation does);
* hard (`hard_attribution`) — a shared token enters the loss once, with the mean advantage of the trajectories
  below it: one of its copies (the *keeper*) carries that advantage and the others carry 0. (Without that
  de-duplication a linear loss would sum the same mean k times, which is the soft result again.)

  Copies are silenced through their advantage, not through the loss mask: every TRL loss is linear in the advantage
  of each token (``grpo``, ``bnpo``, ``dr_grpo``, ``dapo``, ``luspo``, ``cispo``, ``sapo``, ``vespo``), so a copy
  with advantage 0 adds nothing, while the mask, and with it each loss type's normaliser (a row's length for
  ``grpo``/``sapo``, the batch's token count for ``dapo``, …) stays what it is under soft attribution. A kept token
  would weigh what any token of its row weighs under that loss type. (Masking the copies instead would shrink a
  branch row's length to its own few tokens, and ``grpo``/``sapo``, which divide each row by its length, would give
  those tokens a whole sequence's weight.) The keeper is a trajectory whose tokens reach the loss: with
  ``mask_truncated_completions`` a truncated descendant is never chosen while another descendant is not truncated.

  Which descendant keeps a token must not matter. Under a loss that weighs every token alike (``bnpo``,
  ``dr_grpo``, ``dapo``, ``cispo``, ``vespo``, ``luspo``) it does not. Under ``grpo`` and ``sapo`` a token weighs
  1/length of its row, so the keeper's length would decide the shared token's weight (1/80 or 1/40 for the same
  tree, by which descendant came first). There the keeper's value is scaled so that the token weighs the *mean* of
  its descendants' token weights (`row_weights`: 1/length of each row's loss tokens), whichever keeps it.

Tokens are identified through the tree: in a trajectory whose chain of nodes is leaf → … → root, token ``t``
belongs to the deepest node whose ``start`` is ≤ ``t``; two trajectories share token ``t`` exactly when it belongs
to the same node in both.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from arpo_algo.core.tree import RolloutTree

EPS = 1e-4
"""Added to standard deviations, as TRL does."""


def grpo_advantages(rewards: np.ndarray, scale: str = "group") -> np.ndarray:
    """``rewards`` is ``[groups, M]``; returns advantages of the same shape (sample standard deviation, as TRL)."""
    rewards = np.asarray(rewards, dtype=np.float64)
    centred = rewards - rewards.mean(axis=1, keepdims=True)
    if scale == "none":
        return centred
    if scale == "group":
        std = rewards.std(axis=1, ddof=1, keepdims=True) if rewards.shape[1] > 1 else np.zeros_like(rewards[:, :1])
    elif scale == "batch":
        std = np.full_like(rewards[:, :1], rewards.std(ddof=1) if rewards.size > 1 else 0.0)
    else:
        raise ValueError(f"scale must be 'group', 'batch' or 'none', not {scale!r}")
    return centred / (std + EPS)


def reinforce_pp_advantages(rewards: np.ndarray) -> np.ndarray:
    """REINFORCE++: batch-normalised rewards, ``(r − mean_batch) / (std_batch + ε)``, any shape."""
    rewards = np.asarray(rewards, dtype=np.float64)
    std = rewards.std(ddof=1) if rewards.size > 1 else 0.0
    return (rewards - rewards.mean()) / (std + EPS)


def token_owners(tree: RolloutTree, trajectory: int) -> np.ndarray:
    """For each completion token of ``tree.trajectories[trajectory]``, the id of the node it belongs to."""
    traj = tree.trajectories[trajectory]
    by_id = {n.id: n for n in tree.nodes}
    owners = np.empty(len(traj.completion_ids), dtype=np.int64)
    end = len(owners)
    for node_id in tree.ancestors(traj.node):  # leaf first: each ancestor owns the tokens before its child's start
        start = min(by_id[node_id].start, end)
        owners[start:end] = node_id
        end = start
    return owners


PER_SEQUENCE_LOSSES = ("grpo", "sapo")
"""TRL's loss types that divide each row by its own number of loss tokens."""


def row_weights(tree: RolloutTree, loss_type: str) -> list[float] | None:
    """The weight one loss token of each trajectory has under `loss_type`, up to a constant: 1/length of its loss
    tokens (``mask``) for the per-sequence losses; None (all alike) for the others."""
    if loss_type not in PER_SEQUENCE_LOSSES:
        return None
    return [1.0 / max(1, int(np.sum(t.mask))) for t in tree.trajectories]


def hard_attribution(tree: RolloutTree, advantages: Sequence[float], eligible: Sequence[bool] | None = None,
                     weights: Sequence[float] | None = None
                     ) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """Per-token advantages, the keeper of each shared token, and the keeper's scale, for the trajectories of one
    tree.

    Returns ``(token_advantages, keep, scale)``: for trajectory ``i``, ``token_advantages[i][t]`` is the mean of
    ``advantages[j]`` over every trajectory ``j`` that shares token ``t``, and ``keep[i][t]`` is 1 in exactly one
    of those trajectories and 0 in the others. The keeper is the first sharing trajectory that is `eligible` (whose
    tokens reach the loss; all are by default), or the first one when none is. With `weights` (`row_weights`),
    ``scale[i][t]`` is the mean weight of the eligible sharers over row ``i``'s own: what the keeper's value is
    multiplied by so that the token weighs the same whichever sharer keeps it (1 everywhere without `weights`).
    """
    eligible = [True] * len(tree.trajectories) if eligible is None else [bool(e) for e in eligible]
    owners = [token_owners(tree, i) for i in range(len(tree.trajectories))]
    length = max((len(o) for o in owners), default=0)
    nodes = max((n.id for n in tree.nodes), default=-1) + 1
    total = np.zeros((nodes, length))
    count = np.zeros((nodes, length))
    weight_sum = np.zeros((nodes, length))
    weight_count = np.zeros((nodes, length))
    first = np.full((nodes, length), -1, dtype=np.int64)
    positions = np.arange(length)
    # eligible trajectories claim first, so a token goes to an ineligible keeper only when all its sharers are
    for i in sorted(range(len(owners)), key=lambda i: (not eligible[i], i)):
        own = owners[i]
        pos = positions[: len(own)]
        total[own, pos] += advantages[i]
        count[own, pos] += 1
        if weights is not None and eligible[i]:
            weight_sum[own, pos] += weights[i]
            weight_count[own, pos] += 1
        unclaimed = first[own, pos] < 0
        first[own[unclaimed], pos[unclaimed]] = i
    token_adv, keep, scale = [], [], []
    for i, own in enumerate(owners):
        pos = positions[: len(own)]
        token_adv.append(total[own, pos] / count[own, pos])
        keep.append((first[own, pos] == i).astype(np.int64))
        if weights is None or not eligible[i]:
            scale.append(np.ones(len(own)))
        else:
            scale.append(weight_sum[own, pos] / np.maximum(weight_count[own, pos], 1) / weights[i])
    return token_adv, keep, scale


def hard_token_advantages(tree: RolloutTree, advantages: Sequence[float], eligible: Sequence[bool] | None = None,
                          loss_type: str = "dapo") -> list[np.ndarray]:
    """What each token of each trajectory trains on under hard attribution: the mean advantage of the trajectories
    sharing it on its keeper copy, 0 on the other copies (see the module's docstring for why not the mask); under a
    per-sequence `loss_type` the keeper's value is scaled so that the token weighs its descendants' mean weight."""
    token_adv, keep, scale = hard_attribution(tree, advantages, eligible, row_weights(tree, loss_type))
    return [a * k * c for a, k, c in zip(token_adv, keep, scale)]
