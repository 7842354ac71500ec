"""How the chaos history classifies the add-path errors (pure)."""
from __future__ import annotations

from pybk_spark import errors
from tests.chaos.history import FAIL, UNKNOWN, outcome_of


def test_add_aborted_for_lack_of_bookies_is_unknown():
    # the entry was sent: some bookies may hold it
    assert outcome_of(errors.unknown_outcome(errors.NotEnoughBookies("x"))) == UNKNOWN


def test_create_without_enough_bookies_is_a_failure():
    assert outcome_of(errors.NotEnoughBookies("x")) == FAIL


def test_entry_refused_before_its_id_is_a_failure_but_after_it_unknown():
    assert outcome_of(errors.TooLarge("client-side, before an id")) == FAIL
    assert outcome_of(errors.unknown_outcome(errors.TooLarge("a bookie refused it"))) == UNKNOWN


def test_fenced_stays_unknown():
    assert outcome_of(errors.LedgerFenced()) == UNKNOWN
