"""The idle rule without I/O (`store.model.idle`, `release`): tables, as for `decide`."""

from __future__ import annotations

import pytest

from kvsi.store.model import Holders, idle, release


@pytest.mark.parametrize(
    ("last_store", "older_than", "dropped"),
    [
        (10.0, 20.0, True),  # stored before the horizon
        (20.0, 20.0, False),  # stored at it: kept
        (30.0, 20.0, False),
    ],
)
def test_a_residency_is_idle_when_last_stored_before_the_horizon(
    last_store: float, older_than: float, dropped: bool
) -> None:
    assert idle(last_store, older_than) is dropped


@pytest.mark.parametrize(
    ("holders", "after"),
    [
        ("s", None),  # its only holder leaves: the entry stays, held by no session
        ("t", "t"),
        (None, None),
        ({"s", "t"}, "t"),  # one holder left: the bare id again
        ({"s", "t", "u"}, {"t", "u"}),
        ({"t", "u"}, {"t", "u"}),
    ],
)
def test_release_takes_the_session_from_an_entrys_holders(holders: Holders, after: Holders) -> None:
    kept = set(holders) if isinstance(holders, set) else holders
    assert release(holders, "s") == after
    assert holders == kept  # a shared holder set is replaced, never changed in place
