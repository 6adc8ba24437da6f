"""One way to read a status or mode from config, CLI or data: the StrEnum member, or an error naming the field."""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

Choice = TypeVar("Choice", bound=StrEnum)


def parse_choice(kind: type[Choice], value: object, field: str) -> Choice:
    """`value` as a member of `kind`, or a ValueError naming `field`, the valid choices and what was given."""
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{field} must be one of {', '.join(kind)}, got {value!r}") from None
