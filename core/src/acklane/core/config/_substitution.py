"""``${NAME}`` and ``${NAME:-default}`` in string values, to keep secrets out of the file."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

_VARIABLE = re.compile(r"\$(\$?)\{([^{}]*)\}")
_VARIABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: What YAML reads as null in a plain scalar (an empty one included).
NULL_WORDS = frozenset({"", "~", "null", "Null", "NULL"})


def is_one_reference(value: str) -> bool:
    """Whether ``value`` is exactly one ``${...}`` and nothing else (not ``$${...}``)."""
    match = _VARIABLE.fullmatch(value)
    return match is not None and not match.group(1)


def substitute(
    value: str,
    env: Mapping[str, str],
    report: Callable[[str], None],
    used: Callable[[str, str], None] | None = None,
) -> str:
    """``value`` with its variables replaced from ``env``; ``$${`` writes a literal ``${``.

    A reference that cannot be resolved is left as written and ``report`` is called
    with the problem, so that all of a file's problems are found in one pass.
    ``used(name, text)`` is called with each variable that was read and the text it
    put in (its value, or its default), so that secrets can be told apart.
    """

    def replace(match: re.Match[str]) -> str:
        escaped, inner = match.group(1), match.group(2)
        if escaped:
            return "${" + inner + "}"
        name, sep, default = inner.partition(":-")
        if not _VARIABLE_NAME.match(name):
            report(
                f"invalid variable reference ${{{inner}}}: expected ${{NAME}} or "
                "${NAME:-default} (write $${ for a literal ${)"
            )
            return match.group(0)
        current = env.get(name)
        if current:
            if used is not None:
                used(name, current)
            return current
        if sep:
            if used is not None:
                used(name, default)
            return default
        if current is None:
            report(
                f"environment variable {name} is not set (write ${{{name}:-default}} "
                "to give a default)"
            )
            return match.group(0)
        return current

    return _VARIABLE.sub(replace, value)
