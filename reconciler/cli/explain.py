"""Placeholder module, filled in by its issue."""


def register(app) -> None:
    pass
