"""An attribute set, validated and keyed once (docs/semantics.md §4)."""

from __future__ import annotations

import math
from collections.abc import Mapping

AttributeValue = str | bool | int | float


class FrozenAttributes:
    """An attribute set validated and keyed once, for callers that reuse it every record."""

    __slots__ = ("key", "mapping")

    def __init__(self, attributes: Mapping[str, AttributeValue]) -> None:
        """Validate ``attributes``.

        Raises:
            ValueError: A key is not a non-empty string or a value is not a str, bool,
                int or finite float; a string has no UTF-8 form (a lone surrogate, as a
                key read with ``surrogateescape`` carries): every exposition would fail on
                it, a Prometheus scrape with it (docs/semantics.md §4).
        """
        items = []
        for name, value in attributes.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"attribute name must be a non-empty string: {name!r}")
            if not isinstance(value, (str, bool, int, float)) or (
                isinstance(value, float) and not math.isfinite(value)
            ):
                raise ValueError(f"attribute {name!r}: unsupported value {value!r}")
            if isinstance(value, str) and not value.isascii():
                try:
                    value.encode()
                except UnicodeEncodeError:
                    raise ValueError(f"attribute {name!r}: {value!r} has no UTF-8 form") from None
            items.append((name, value))
        self.key: tuple[tuple[str, AttributeValue], ...] = tuple(sorted(items))
        self.mapping: dict[str, AttributeValue] = dict(self.key)


NO_ATTRIBUTES = FrozenAttributes({})
