"""The memory page's names: the signed-in user's display name and human category names."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from auth.local_accounts import LocalAccounts
from graphs.memory.policy import CATEGORIES, SENSITIVE_CATEGORIES
from tests.unit.test_local_oidc import InMemoryAccountStore
from ui.memory_page import CATEGORY_LABELS, NO_NAME, category_label, display_name


def test_every_memory_category_has_a_human_name():
    assert CATEGORY_LABELS.keys() == CATEGORIES
    assert all("_" not in label for label in CATEGORY_LABELS.values())


def test_sensitive_categories_say_so():
    assert category_label("finance_sensitive") == "Finance (sensitive)"
    for key in SENSITIVE_CATEGORIES:
        assert category_label(key).endswith("(sensitive)")
    for key in CATEGORIES - SENSITIVE_CATEGORIES:
        assert "sensitive" not in category_label(key)


@pytest.mark.parametrize("key", ["", "finance sensitive", "<b>x</b>", "Health"])
def test_an_unknown_category_reads_as_other(key):
    assert category_label(key) == "Other"


async def _accounts(display: str | None) -> tuple[LocalAccounts, str]:
    accounts = LocalAccounts(store=InMemoryAccountStore())
    account = await accounts.create("dave", "correct horse battery", display_name=display)
    return accounts, f"cairn:{account.subject}"


async def test_the_name_the_login_gave_is_shown_not_the_account_id():
    accounts, user_id = await _accounts("Dave Local")
    user = {"identifier": user_id, "display_name": "Dave from the provider"}
    runtime = SimpleNamespace(accounts=accounts)
    assert await display_name(user, user_id, runtime) == "Dave from the provider"


@pytest.mark.parametrize(("display", "shown"), [("Dave Local", "Dave Local"), (None, "dave")])
async def test_without_a_session_name_the_local_account_names_the_user(display, shown):
    accounts, user_id = await _accounts(display)
    user = {"identifier": user_id}
    runtime = SimpleNamespace(accounts=accounts)
    assert await display_name(user, user_id, runtime) == shown


async def test_an_unnamed_user_of_another_provider_never_sees_the_raw_id():
    accounts, _ = await _accounts("Dave Local")
    user_id = "github:12345"
    user = {"identifier": user_id, "display_name": "  "}
    runtime = SimpleNamespace(accounts=accounts)
    assert await display_name(user, user_id, runtime) == NO_NAME
