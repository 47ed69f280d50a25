"""Typed field access that fails with an error naming the file, the record and the field."""

from __future__ import annotations

import builtins
import json
from collections.abc import Mapping
from typing import Any, Literal, overload

# Integers land in 64-bit columns: a larger one is refused here rather than overflowing there.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class WitnessError(ValueError):
    """A witness or marker that cannot be read.

    Attributes
    ----------
    source : str
        The file or URL.
    record : str
        Where in it, e.g. ``bands[2] (c=8).slots[3]``; ``$`` is the top level.
    field : str or None
        The offending field, when one is to blame.
    """

    def __init__(self, source: str, record: str, field: str | None, problem: str) -> None:
        self.source, self.record, self.field, self.problem = source, record, field, problem
        where = f"{record}.{field}" if field else record
        super().__init__(f"{source}: {where}: {problem}")


def describe(value: Any) -> str:
    """A short, JSON-flavoured description of a value for error messages.

    Parameters
    ----------
    value : Any
        A value parsed from JSON; anything else is written with ``str``.

    Returns
    -------
    str
        Its type name (``null`` for None) and at most 60 characters of its JSON.
    """
    text = json.dumps(value, default=str)
    kind = type(value).__name__ if value is not None else "null"
    return f"{kind} {text[:60]}{'...' if len(text) > 60 else ''}"


class Fields:
    """Read typed fields of one JSON object, remembering which keys were used.

    Examples
    --------
    >>> f = Fields({"c": 4, "note": "x"}, source="w.json", record="bands[0]")
    >>> f.int("c"), f.unused()
    (4, {'note': 'x'})
    >>> f.int("note")
    Traceback (most recent call last):
    ...
    analysis.WitnessError: w.json: bands[0].note: expected an integer, got str "x"
    """

    def __init__(self, obj: Any, *, source: str, record: str) -> None:
        if not isinstance(obj, Mapping):
            raise WitnessError(source, record, None, f"expected a JSON object, got {describe(obj)}")
        duplicated = sorted(getattr(obj, "duplicates", ()))
        if duplicated:
            raise WitnessError(source, record, duplicated[0], "key appears more than once")
        self.obj, self.source, self.record = obj, source, record
        self._used: set[str] = set()

    def _get(self, key: str, required: bool) -> Any:
        self._used.add(key)
        if key not in self.obj:
            if required:
                raise WitnessError(self.source, self.record, key, "required field is missing")
            return None
        return self.obj[key]

    def _fail(self, key: str, expected: str, value: Any) -> WitnessError:
        return WitnessError(self.source, self.record, key, f"expected {expected}, got {describe(value)}")

    # The readers are named after the types they return, so inside the class ``str``, ``int``, ``bool`` and ``list``
    # name these methods: annotations spell the builtins as ``builtins.*``. ``required=True`` never returns None.
    @overload
    def int(self, key: builtins.str, *, required: Literal[True], nonnegative: builtins.bool = True) -> builtins.int: ...
    @overload
    def int(
        self, key: builtins.str, *, required: builtins.bool = False, nonnegative: builtins.bool = True
    ) -> builtins.int | None: ...
    def int(
        self, key: builtins.str, *, required: builtins.bool = False, nonnegative: builtins.bool = True
    ) -> builtins.int | None:
        """An integer (never a bool or a float), or None when absent or null.

        Parameters
        ----------
        key : str
            The field's name.
        required : bool, default False
            Refuse an absent or null field.
        nonnegative : bool, default True
            Refuse a negative integer.

        Returns
        -------
        int or None

        Raises
        ------
        WitnessError
            The value is not an integer, is out of range or is missing when required.
        """
        value = self._get(key, required)
        if value is None:
            if required:
                raise self._fail(key, "an integer", value)
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._fail(key, "an integer", value)
        if nonnegative and not 0 <= value <= INT64_MAX:
            raise self._fail(key, f"a non-negative integer of at most {INT64_MAX} (2^63 - 1)", value)
        if not INT64_MIN <= value <= INT64_MAX:
            raise self._fail(key, "an integer that fits in 64 bits", value)
        return value

    def number(self, key: builtins.str) -> float | None:
        """A JSON number (integers allowed) as float, or None.

        Parameters
        ----------
        key : str
            The field's name; an absent or null field gives None.

        Returns
        -------
        float or None

        Raises
        ------
        WitnessError
            The value is not a number (a bool is not), or is beyond a 64-bit float.
        """
        value = self._get(key, False)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._fail(key, "a number", value)
        try:
            return float(value)
        except OverflowError:
            raise self._fail(key, "a number within a 64-bit float's range", value) from None

    @overload
    def str(self, key: builtins.str, *, required: Literal[True]) -> builtins.str: ...
    @overload
    def str(self, key: builtins.str, *, required: builtins.bool = False) -> builtins.str | None: ...
    def str(self, key: builtins.str, *, required: builtins.bool = False) -> builtins.str | None:
        """A string, or None when absent or null.

        Parameters
        ----------
        key : str
            The field's name.
        required : bool, default False
            Refuse an absent or null field.

        Returns
        -------
        str or None

        Raises
        ------
        WitnessError
            The value is not a string, or is missing when required.
        """
        value = self._get(key, required)
        if value is None and not required:
            return None
        if not isinstance(value, str):
            raise self._fail(key, "a string", value)
        return value

    def bool(self, key: builtins.str) -> builtins.bool | None:
        """A boolean, or None.

        Parameters
        ----------
        key : str
            The field's name; an absent or null field gives None.

        Returns
        -------
        bool or None

        Raises
        ------
        WitnessError
            The value is not ``true`` or ``false``.
        """
        value = self._get(key, False)
        if value is None or isinstance(value, bool):
            return value
        raise self._fail(key, "true or false", value)

    @overload
    def list(self, key: builtins.str, *, required: Literal[True]) -> builtins.list[Any]: ...
    @overload
    def list(self, key: builtins.str, *, required: builtins.bool = False) -> builtins.list[Any] | None: ...
    def list(self, key: builtins.str, *, required: builtins.bool = False) -> builtins.list[Any] | None:
        """A JSON array, or None when absent or null (an error when required).

        Parameters
        ----------
        key : str
            The field's name.
        required : bool, default False
            Refuse an absent or null field.

        Returns
        -------
        list or None

        Raises
        ------
        WitnessError
            The value is not an array, or is missing when required.
        """
        value = self._get(key, required)
        if value is None and not required:
            return None
        if not isinstance(value, list):
            raise self._fail(key, "a list", value)
        return value

    def child(self, key: builtins.str, record: builtins.str | None = None) -> Fields | None:
        """The nested object at ``key`` as Fields, or None when absent or null.

        Parameters
        ----------
        key : str
            The field's name.
        record : str, optional
            Where the child is, for its errors; ``<this record>.<key>`` when None.

        Returns
        -------
        Fields or None

        Raises
        ------
        WitnessError
            The value is not an object, or has a duplicated key.
        """
        value = self._get(key, False)
        if value is None:
            return None
        return Fields(value, source=self.source, record=record or f"{self.record}.{key}")

    def unused(self) -> dict[builtins.str, Any]:
        """The fields nobody asked for, so they can be kept rather than dropped."""
        return {k: v for k, v in self.obj.items() if k not in self._used}
