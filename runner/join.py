"""Joining predictions to their input: which columns feed the model, which ride along.

Three keys of the **input** entry, whatever its provider (``http``, ``krateo`` or
any other; :func:`runner.storage.resolve` takes them out before the provider
sees its settings), as SageMaker's ``InputFilter``/``JoinSource`` and Vertex AI's
``keyField``/``includedFields`` do::

    input:
      postgres:                       # or http, krateo, ...
        ...
        columns: [sepal_length, sepal_width, petal_length, petal_width]
        keyColumn: id
        passthroughColumns: [species]

- ``columns``: the input columns that are the model's features, in the order
  the model takes them. Without it, a row's features are all its columns but the
  key and the passthrough ones, in the order of the first row. A single column
  whose value is a list (a vector, a time series) is the row itself.
- ``keyColumn``: a column copied into each output row beside the prediction, so
  predictions can be joined back to their input without relying on row order.
  It may not be null.
- ``passthroughColumns``: more columns copied the same way.

Any of the three makes the runner read each input row as an object with named
columns (a JSON object; a provider with typed rows gives them so): a row that is
a list of values, or that lacks a named column, is refused (exit 6, the input's
fault) with the row's number and the column's name. Without any of them rows go
to the model as the input gives them, as before.

With ``keyColumn`` or ``passthroughColumns`` each output row is an object: the
carried columns, then ``prediction`` (the model's value for that row; a list when
the model answers several values per row). Without them the output is the
predictions alone, as before.

Pure logic, no I/O: the runner calls :meth:`RowSplitter.split` on each batch of
rows it reads and :func:`join` on their predictions before storing them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

# The input entry's keys this module reads (its settings, in the contract's spelling).
JOIN_KEYS = ("columns", "keyColumn", "passthroughColumns")
# The field of an output row holding the model's answer.
PREDICTION_FIELD = "prediction"


class SelectionError(ValueError):
    """A row cannot be split as the settings say: the input's fault (exit 6)."""


class Selection(BaseModel):
    """The join keys of an input entry (module docstring)."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )

    columns: list[str] | None = Field(default=None, min_length=1)
    key_column: str | None = Field(default=None, min_length=1, max_length=256)
    passthrough_columns: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _names(self) -> Selection:
        for what, names in (("columns", self.columns or []), ("carried", self.carried)):
            if any(not name for name in names):
                raise ValueError(f"{what}: a column name may not be empty")
            repeated = sorted({name for name in names if names.count(name) > 1})
            if repeated:
                if what == "carried":
                    raise ValueError(
                        f"keyColumn and passthroughColumns name {repeated} more than once"
                    )
                raise ValueError(f"columns name {repeated} more than once")
        if PREDICTION_FIELD in self.carried:
            raise ValueError(
                f"{PREDICTION_FIELD!r} is the output field of the model's answer: "
                "it cannot be a keyColumn or passthrough column"
            )
        return self

    @property
    def carried(self) -> list[str]:
        """The columns copied into each output row, the key first."""
        key = [self.key_column] if self.key_column else []
        return [*key, *self.passthrough_columns]

    @property
    def joins(self) -> bool:
        """Whether the output rows are objects (something is carried)."""
        return bool(self.carried)


def split_settings(settings: Any) -> tuple[Any, Selection | None]:
    """An entry's settings without the join keys, and those keys parsed (None if absent).

    :class:`ValueError` (the contract is wrong: exit 2) when they do not parse.
    """
    if not isinstance(settings, Mapping):
        return settings, None
    rest = {k: v for k, v in settings.items() if k not in JOIN_KEYS}
    given = {k: v for k, v in settings.items() if k in JOIN_KEYS}
    if not given:
        return rest, None
    try:
        return rest, Selection.model_validate(given)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in issue['loc']) or '(entry)'}: {issue['msg']}"
            for issue in error.errors()
        )
        raise ValueError(problems) from None


def _kind(row: Any) -> str:
    if isinstance(row, list):
        return "a list of values"
    if row is None:
        return "null"
    return f"a single {type(row).__name__} value"


@dataclass
class RowSplitter:
    """Splits rows into the model's features and the carried values (module docstring).

    ``where(n)`` names row ``n`` (of a page, counted from 0) in error messages; the
    caller passes it with each call. The feature columns, when ``columns`` is not
    given, are fixed by the first row seen and kept for every later row.
    """

    selection: Selection
    columns: list[str] | None = field(default=None)

    def __post_init__(self) -> None:
        if self.columns is None and self.selection.columns is not None:
            self.columns = list(self.selection.columns)

    def _columns_for(self, row: Mapping[str, Any], where: str) -> list[str]:
        if self.columns is None:
            carried = set(self.selection.carried)
            derived = [name for name in row if name not in carried]
            if not derived:
                raise SelectionError(
                    f"{where} has no column left for the model's features once keyColumn and "
                    f"passthroughColumns are taken out (its columns: {_listed(row)})"
                )
            self.columns = derived
        return self.columns

    def split(
        self, rows: Sequence[Any], first: int = 0, name: str = "row"
    ) -> tuple[list[Any], list[tuple[Any, ...]]]:
        """``(features, carried)`` for ``rows``; row ``i`` is called ``f"{name} {first + i}"``.

        Rows are taken apart by ``operator.itemgetter`` over the whole page (C loops,
        not a Python loop per value); a page where that fails is walked row by row
        for the precise message (:meth:`_split_rows`).
        """
        if not rows or not isinstance(rows[0], Mapping):
            return self._split_rows(rows, first, name)
        columns = self._columns_for(rows[0], f"{name} {first}")
        carried_names = self.selection.carried
        try:
            picked = list(map(itemgetter(*columns), rows))
            kept = list(map(itemgetter(*carried_names), rows)) if carried_names else []
        except (KeyError, TypeError, IndexError):
            return self._split_rows(rows, first, name)
        if len(columns) == 1:
            features = [value if isinstance(value, list) else [value] for value in picked]
        else:
            features = list(map(list, picked))
        if len(carried_names) == 1:
            kept = [(value,) for value in kept]
        if self.selection.key_column is not None and any(k[0] is None for k in kept):
            return self._split_rows(rows, first, name)
        return features, kept

    def _split_rows(
        self, rows: Sequence[Any], first: int, name: str
    ) -> tuple[list[Any], list[tuple[Any, ...]]]:
        """:meth:`split`, one row at a time: the first row that cannot be split says why."""
        carried_names = self.selection.carried
        features: list[Any] = []
        carried: list[tuple[Any, ...]] = []
        for number, row in enumerate(rows, start=first):
            if not isinstance(row, Mapping):
                raise SelectionError(
                    f"{name} {number} is {_kind(row)}, not an object with named columns: "
                    f"{_which(self.selection)} name columns, so every row must have them"
                )
            where = f"{name} {number}"
            columns = self._columns_for(row, where)
            try:
                values = [row[column] for column in columns]
            except KeyError as missing:
                raise SelectionError(
                    f"{where} has no column {missing.args[0]!r}, which "
                    f"{'columns names' if self.selection.columns else 'the first row had'} "
                    f"(its columns: {_listed(row)})"
                ) from None
            vector = len(values) == 1 and isinstance(values[0], list)
            features.append(values[0] if vector else values)
            if carried_names:
                try:
                    kept = tuple(row[column] for column in carried_names)
                except KeyError as missing:
                    role = (
                        "keyColumn"
                        if missing.args[0] == self.selection.key_column
                        else "passthroughColumns"
                    )
                    raise SelectionError(
                        f"{where} has no column {missing.args[0]!r}, named in {role} "
                        f"(its columns: {_listed(row)})"
                    ) from None
                if self.selection.key_column is not None and kept[0] is None:
                    raise SelectionError(
                        f"{where}: its keyColumn {self.selection.key_column!r} is null, so its "
                        "prediction could not be joined back to it"
                    )
                carried.append(kept)
        return features, carried


def _which(selection: Selection) -> str:
    given = [
        key
        for key, value in (
            ("columns", selection.columns),
            ("keyColumn", selection.key_column),
            ("passthroughColumns", selection.passthrough_columns),
        )
        if value
    ]
    return " and ".join(given) or "the join settings"


def _listed(row: Mapping[str, Any], limit: int = 20) -> str:
    names = [repr(str(name)) for name in list(row)[:limit]]
    more = f", ... ({len(row)} in all)" if len(row) > limit else ""
    return ", ".join(names) + more if names else "none"


def join(
    selection: Selection, carried: Sequence[tuple[Any, ...]], predictions: list[Any]
) -> list[Any]:
    """The output rows: ``predictions`` alone, or objects with the carried columns.

    ``predictions`` is the rows' answers flattened (``n * k`` values for ``n``
    rows); each output row gets its ``k`` values (one value when ``k`` is 1).
    """
    if not selection.joins:
        return predictions
    rows = len(carried)
    if rows == 0:
        return []
    per_row, rest = divmod(len(predictions), rows)
    if rest or per_row == 0:
        raise SelectionError(f"{len(predictions)} prediction(s) for {rows} row(s)")
    names = selection.carried
    if per_row == 1:
        return [
            {**dict(zip(names, kept, strict=True)), PREDICTION_FIELD: value}
            for kept, value in zip(carried, predictions, strict=True)
        ]
    return [
        {
            **dict(zip(names, kept, strict=True)),
            PREDICTION_FIELD: predictions[i * per_row : (i + 1) * per_row],
        }
        for i, kept in enumerate(carried)
    ]
