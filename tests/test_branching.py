"""ARPO's branching decision and budget, as pure functions (`arpo_algo.core.branching`): no model, no env, no torch."""

from __future__ import annotations

import math
import sys

import pytest

from arpo_algo.core.branching import (
    Decision,
    branch_probability,
    capacity,
    decide,
    expected_growth,
    expected_trajectories,
    speculation_pays,
    top_ups_needed,
    uniform_draw,
)


def test_the_probability_is_alpha_plus_beta_delta_clipped():
    assert branch_probability(0.5, 0.2, 1.0) == pytest.approx(0.7)
    assert branch_probability(0.5, 0.2, -1.0) == pytest.approx(0.3)
    assert branch_probability(0.5, 0.2, 10.0) == 1.0 and branch_probability(0.5, 0.2, -10.0) == 0.0
    for unknown in (None, math.nan, math.inf, -math.inf):  # no measured token: the base probability
        assert branch_probability(0.5, 0.2, unknown) == 0.5
    assert branch_probability(1.5, 0.0, 0.0) == 1.0  # α itself is clipped too


def test_a_decision_branches_when_its_draw_falls_below_p():
    # H rose by 1 over H0: P = 0.5 + 0.2 = 0.7
    assert decide(3.0, 2.0, 0.69, 0.5, 0.2, branch_factor=2, room=5) == Decision(1.0, pytest.approx(0.7), True, 1)
    assert decide(3.0, 2.0, 0.71, 0.5, 0.2, branch_factor=2, room=5) == Decision(1.0, pytest.approx(0.7), False, 0)
    # Z = 4 makes three new paths, unless the task has less room before M
    assert decide(3.0, 2.0, 0.0, 0.5, 0.2, branch_factor=4, room=5).new_paths == 3
    assert decide(3.0, 2.0, 0.0, 0.5, 0.2, branch_factor=4, room=2).new_paths == 2


def test_no_branch_without_room_or_without_a_second_path():
    full = decide(3.0, 2.0, 0.0, 0.5, 0.2, branch_factor=2, room=0)
    assert full is not None and not full.branched and full.new_paths == 0 and full.p == pytest.approx(0.7)
    assert not decide(3.0, 2.0, 0.0, 0.5, 0.2, branch_factor=1, room=3).branched  # Z = 1: a branch is the path


def test_an_empty_segment_has_no_decision():
    assert decide(None, 2.0, 0.0, 0.5, 0.2, 2, 3) is None  # nothing measured after the tool result
    assert decide(2.0, None, 0.0, 0.5, 0.2, 2, 3) is None  # the first window was empty: no H0


def test_draws_depend_on_their_name_not_on_the_order_they_are_asked_in():
    names = [(0, 1, 2, 3), (0, 1, 2, 4), (1, 1, 2, 3), (0, 2, 2, 3)]
    first = [uniform_draw(*name) for name in names]
    again = [uniform_draw(*name) for name in reversed(names)][::-1]
    assert first == again and len(set(first)) == len(first) and all(0 <= d < 1 for d in first)


def test_capacity_is_z_to_the_tool_steps_left():
    assert capacity(3, 2, can_branch=True) == 8
    assert capacity(0, 2, can_branch=True) == 1
    assert capacity(3, 2, can_branch=False) == 1  # a top-up or GRPO: one trajectory
    assert capacity(3, 1, can_branch=True) == 1
    assert capacity(10_000, 2, can_branch=True) == 2 ** 20  # capped, not a number of ten thousand bits


def test_top_ups_are_what_the_most_the_live_paths_can_make_leaves_short():
    assert top_ups_needed(8, finished=3, capacities=[2, 1]) == 2
    assert top_ups_needed(8, finished=3, capacities=[8]) == 0
    assert top_ups_needed(8, finished=9, capacities=[]) == 0


def test_expected_trajectories_grow_with_p_and_the_steps_a_path_has_left():
    assert expected_growth(2, 0.5, 2) == pytest.approx(1.5 ** 2)
    assert expected_growth(2, 0.5, -1) == 1  # a path past the mean: itself
    # one finished, a top-up (1), a path with 2 steps to the mean (1.5^2), one whose budget allows only 1 (1.5)
    paths = [(True, 0, 5), (False, 1, 5), (False, 0, 1)]
    assert expected_trajectories(1, paths, 2, 0.5, mean_steps=3) == pytest.approx(1 + 1 + 2.25 + 1.5)


def test_speculation_starts_where_the_decision_is_likely_to_keep_its_branches():
    deltas = [-2.0, -1.0, 0.0, 1.0, 2.0]  # median 0: P = 0.5
    assert speculation_pays(0.49, 0.5, 0.2, deltas, 0.5)
    assert not speculation_pays(0.51, 0.5, 0.2, deltas, 0.5)
    assert speculation_pays(0.99, 0.5, 0.2, deltas, 0.0)  # 0: at every decision
    assert not speculation_pays(0.35, 0.5, 0.2, deltas, 1.0)  # 1: below the P of the smallest ΔH (0.1)
    assert speculation_pays(0.49, 0.5, 0.2, [], 0.5)  # none seen yet: ΔH = 0


def test_the_branching_maths_imports_no_torch():
    import subprocess

    code = ("import sys, arpo_algo.core.branching, arpo_algo.core.config, arpo_algo.core.entropy\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
