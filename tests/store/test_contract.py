"""The shared contract: every check in kelp.store.checks against every backend."""

from __future__ import annotations

import pytest

from kelp.store.checks import ALL_CHECKS, MakeStore

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_contract(make_store: MakeStore, check) -> None:  # type: ignore[no-untyped-def]
    check(make_store)
