"""Hindsight: candidate splits scored against the speeds then measured (lbbsp's choice of how to balance)."""
import numpy as np
import pytest

from lbbsp.hindsight import Hindsight
from lbbsp.membership import remap_workers


def test_the_candidate_that_would_have_been_faster_is_chosen():
    choice = Hindsight(2, rate=0.2)
    assert choice.best == 0  # before any score: the first
    speeds, offsets = np.array([1.0, 3.0]), np.zeros(2)
    for step in range(10):
        choice.propose(step, [[50.0, 50.0], [25.0, 75.0]])  # the second balances these speeds
        choice.observe(step, speeds, offsets)
    assert choice.best == 1 and choice.scored == 10
    # The first would take 50 s, the second 25 s: the score tends to log(25 / 50).
    assert choice.scores[1] == pytest.approx(np.log(0.5) * (1 - 0.8 ** 10))


def test_ties_keep_the_first_and_only_the_proposed_step_is_scored():
    choice = Hindsight(3)
    choice.propose(5, np.ones((3, 4)))
    choice.propose(3, np.ones((3, 4)))
    choice.observe(4, np.ones(4), np.zeros(4))  # nothing proposed for step 4; the proposal for 3 is stale now
    assert choice.scored == 0 and list(choice.state()["_proposed"]) == [5]
    choice.observe(5, np.ones(4), np.zeros(4))
    assert choice.scored == 1 and choice.best == 0


def test_workers_that_measured_nothing_are_left_out_and_nothing_measured_scores_nothing():
    choice = Hindsight(2)
    choice.propose(0, [[10.0, 1.0], [1.0, 10.0]])
    choice.observe(0, np.array([1.0, np.nan]), np.zeros(2))
    assert choice.best == 1
    choice.propose(1, [[10.0, 1.0], [1.0, 10.0]])
    before = choice.scores.copy()
    choice.observe(1, np.array([np.nan, 0.0]), np.zeros(2))
    np.testing.assert_array_equal(choice.scores, before)


def test_state_round_trip_and_the_scores_are_not_taken_for_per_worker_values():
    choice = Hindsight(3)
    choice.propose(0, [[1.0, 2.0, 3.0], [3.0, 2.0, 1.0], [2.0, 2.0, 2.0]])
    choice.observe(0, np.array([1.0, 1.0, 1.0]), np.zeros(3))
    choice.propose(1, np.ones((3, 3)))
    state = choice.state()
    # Three candidates and three workers: a membership change must remap the proposals, not the scores.
    moved = remap_workers(state, np.array([2, 1, 0]), 3)
    assert moved["scores"] == state["scores"]
    np.testing.assert_array_equal(moved["_proposed"][1], np.ones((3, 3)))
    copy = Hindsight(3)
    copy.load_state(moved)
    np.testing.assert_array_equal(copy.scores, choice.scores)
    with pytest.raises(ValueError, match="for 3 candidates"):
        Hindsight(2).load_state(state)


@pytest.mark.parametrize("kwargs, bad", [({"candidates": 0}, "candidates=0"), ({"candidates": True}, "candidates=True"),
                                         ({"candidates": 2, "rate": 0.0}, "rate=0.0"),
                                         ({"candidates": 2, "rate": 1.5}, "rate=1.5"),
                                         ({"candidates": 2, "margin": -0.1}, "margin=-0.1")])
def test_bad_arguments_name_the_value(kwargs, bad):
    with pytest.raises(ValueError, match=bad):
        Hindsight(**kwargs)


def test_a_proposal_of_the_wrong_shape_is_refused():
    with pytest.raises(ValueError, match="give 2 rows"):
        Hindsight(2).propose(0, np.ones((3, 4)))


def test_a_proposal_is_kept_as_it_was_when_the_caller_reuses_its_array():
    choice = Hindsight(2)
    splits = np.array([[2.0, 2.0], [1.0, 3.0]])  # the second balances speeds (1, 3)
    choice.propose(0, splits)
    splits[:] = [[1.0, 3.0], [2.0, 2.0]]
    choice.observe(0, np.array([1.0, 3.0]), np.zeros(2))
    assert choice.best == 1


def test_the_choice_moves_only_for_a_gain_beyond_the_margin_and_then_stays():
    choice = Hindsight(2, rate=0.5, margin=0.01)
    speeds, offsets = np.array([1.0, 1.0]), np.zeros(2)
    for step in range(20):  # the second would be 0.5% faster: not worth a move
        choice.propose(step, [[100.0, 100.0], [99.5, 99.5]])
        choice.observe(step, speeds, offsets)
    assert choice.best == 0 and choice.scores[1] == pytest.approx(np.log(0.995))
    for step in range(20, 40):  # 3% faster: it moves
        choice.propose(step, [[100.0, 100.0], [97.0, 97.0]])
        choice.observe(step, speeds, offsets)
    assert choice.best == 1
    for step in range(40, 60):  # the first is now 0.5% faster: within the margin, the choice stays
        choice.propose(step, [[99.5, 99.5], [100.0, 100.0]])
        choice.observe(step, speeds, offsets)
    assert choice.best == 1 and choice.scores[1] > choice.scores[0]
