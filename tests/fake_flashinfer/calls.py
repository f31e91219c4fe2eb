"""The record of original-API calls, and the fixture that clears it and turns apply off."""

import warnings

import pytest

CALLS: list[str] = []


@pytest.fixture(autouse=True)
def clean_apply():
    """Autouse where imported: each test starts with no calls recorded and ends with apply
    and tracing off (a test that leaves a solution unmatched is not warned about here)."""
    import fibgen.runtime as rt

    CALLS.clear()
    yield
    rt.disable_tracing()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rt.disable_apply()
