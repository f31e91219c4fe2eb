"""The record of original-API calls."""

CALLS: list[str] = []
