"""JSON as Python holds it once parsed: one recursive type for what :func:`json.loads` returns, and a parser that
refuses the NaN and Infinity that Python's takes (they are not JSON). Standard library only: the stdio wire and the
``initialize`` record use it before the MCP SDK has loaded."""

from __future__ import annotations

import json
from typing import NoReturn, TypeAlias

JSONValue: TypeAlias = "bool | int | float | str | list[JSONValue] | dict[str, JSONValue] | None"
JSONObject: TypeAlias = "dict[str, JSONValue]"


def parse_json(text: str | bytes) -> JSONValue:
    """``text`` parsed as JSON.

    :raises ValueError: ``text`` is not JSON (NaN, Infinity and -Infinity included).
    :raises RecursionError: ``text`` nests deeper than the parser goes.
    """
    return json.loads(text, parse_constant=_refuse_constant)


def _refuse_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")
