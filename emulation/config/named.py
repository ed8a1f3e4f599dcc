"""Fields that name an entry of a profile table (a model, a GPU, a link)."""

from collections.abc import Mapping
from typing import Any

from pydantic import AfterValidator


def named(kind: str, table: Mapping[str, Any]) -> AfterValidator:
    """A field's check that its value is a key of `table` (or None, where the field allows it); the
    error lists the keys."""

    def check(value: str | None) -> str | None:
        if value is not None and value not in table:
            raise ValueError(f"unknown {kind}; allowed: {', '.join(table)}")
        return value

    return AfterValidator(check)
