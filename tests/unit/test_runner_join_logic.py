"""Joining predictions to their input (runner/join.py): settings, splitting rows, output rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from contract.document import Contract
from contract.exitcodes import ContractError
from runner import storage
from runner.app import RunnerEnv, plan
from runner.join import RowSplitter, Selection, SelectionError, join, split_settings

pytestmark = pytest.mark.unit

HTTP_INPUT: dict[str, Any] = {"secretRef": {"name": "rows"}, "method": "GET", "path": "/rows"}
HTTP_OUTPUT: dict[str, Any] = {"secretRef": {"name": "rows"}, "path": "/predictions"}


def contract(input_extra: dict[str, Any], output_extra: dict[str, Any] | None = None) -> Contract:
    return Contract.model_validate(
        {
            "jobId": "j",
            "jobName": "n",
            "kserve": {"modelUrl": "http://127.0.0.1:1/v2/models/m/infer"},
            "input": {"http": {**HTTP_INPUT, **input_extra}},
            "output": {"http": {**HTTP_OUTPUT, **(output_extra or {})}},
        }
    )


def env() -> RunnerEnv:
    return RunnerEnv(Path("c"), Path("t"), "pod", "ns", None, None)


def test_the_join_keys_are_taken_out_before_the_provider_sees_them() -> None:
    work = plan(contract({"columns": ["a", "b"], "keyColumn": "id"}), env())
    assert work.selection == Selection(columns=["a", "b"], key_column="id")
    # The http provider forbids keys it does not know: it was built, so it never saw them.
    assert work.input.key == "http"


def test_without_join_keys_there_is_no_selection() -> None:
    assert plan(contract({}), env()).selection is None
    assert split_settings({"a": 1}) == ({"a": 1}, None)


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"columns": []}, "columns"),
        ({"columns": ["a", "a"]}, "columns name ['a'] more than once"),
        ({"keyColumn": "id", "passthroughColumns": ["id"]}, "more than once"),
        ({"keyColumn": "prediction"}, "'prediction' is the output field"),
        ({"passthroughColumns": "species"}, "passthroughColumns"),
        ({"columns": [""]}, "may not be empty"),
    ],
)
def test_wrong_join_keys_are_a_contract_error(extra: dict[str, Any], says: str) -> None:
    with pytest.raises(ContractError, match=r"^input\.http: ") as error:
        plan(contract(extra), env())
    assert says in str(error.value)


def test_join_keys_in_the_output_entry_are_refused_and_say_where_they_belong() -> None:
    with pytest.raises(ContractError, match="belong to the input entry") as error:
        plan(contract({}, {"keyColumn": "id"}), env())
    assert "output.http: keyColumn" in str(error.value)


def test_resolve_refuses_output_join_keys_itself() -> None:
    with pytest.raises(ValueError, match="belong to the input entry"):
        storage.resolve({"http": {**HTTP_OUTPUT, "columns": ["a"]}}, "output", {})


def test_columns_pick_the_features_in_their_order_and_carry_the_key() -> None:
    splitter = RowSplitter(
        Selection(columns=["b", "a"], key_column="id", passthrough_columns=["tag"])
    )
    rows = [
        {"id": 7, "a": 1.0, "b": 2.0, "tag": "x", "other": 9},
        {"id": 8, "a": 3, "b": 4, "tag": None},
    ]
    features, carried = splitter.split(rows)
    assert features == [[2.0, 1.0], [4, 3]]
    assert carried == [(7, "x"), (8, None)]


def test_without_columns_the_features_are_the_first_rows_columns_but_the_carried_ones() -> None:
    splitter = RowSplitter(Selection(key_column="id"))
    features, carried = splitter.split([{"id": "r1", "x": 1, "y": 2}, {"y": 4, "x": 3, "id": "r2"}])
    # The second row's keys come in another order: the first row's order holds.
    assert features == [[1, 2], [3, 4]]
    assert carried == [("r1",), ("r2",)]
    assert splitter.columns == ["x", "y"]


def test_one_list_valued_column_is_the_row_itself() -> None:
    splitter = RowSplitter(Selection(columns=["series"], key_column="id"))
    features, _ = splitter.split([{"id": 1, "series": [0.5, 0.25, 0.125]}])
    assert features == [[0.5, 0.25, 0.125]]


def test_a_missing_feature_column_names_the_row_and_the_column() -> None:
    splitter = RowSplitter(Selection(columns=["a", "b"]))
    with pytest.raises(SelectionError) as error:
        splitter.split([{"a": 1, "b": 2}, {"a": 1, "c": 3}], first=40)
    message = str(error.value)
    assert message.startswith("row 41 has no column 'b', which columns names")
    assert "'a', 'c'" in message


def test_a_missing_key_or_passthrough_column_says_which_setting_names_it() -> None:
    splitter = RowSplitter(Selection(columns=["a"], key_column="id", passthrough_columns=["p"]))
    with pytest.raises(SelectionError, match=r"row 0 has no column 'id', named in keyColumn"):
        splitter.split([{"a": 1, "p": 2}])
    with pytest.raises(SelectionError, match=r"row 0 has no column 'p', named in passthrough"):
        splitter.split([{"a": 1, "id": 2}])


def test_a_null_key_is_refused() -> None:
    with pytest.raises(SelectionError, match=r"shard 1/2 row 3: its keyColumn 'id' is null"):
        RowSplitter(Selection(key_column="id")).split([{"id": None, "a": 1}], 3, "shard 1/2 row")


@pytest.mark.parametrize(
    ("row", "kind"), [([1, 2], "a list of values"), (5, "a single int value"), (None, "null")]
)
def test_a_row_without_named_columns_is_refused(row: Any, kind: str) -> None:
    with pytest.raises(SelectionError) as error:
        RowSplitter(Selection(columns=["a"])).split([row])
    assert str(error.value).startswith(f"row 0 is {kind}, not an object with named columns")
    assert "columns name columns" in str(error.value)


def test_a_row_of_carried_columns_only_leaves_no_features() -> None:
    with pytest.raises(SelectionError, match="no column left for the model's features"):
        RowSplitter(Selection(key_column="id")).split([{"id": 1}])


def test_join_puts_the_carried_columns_beside_each_prediction() -> None:
    selection = Selection(key_column="id", passthrough_columns=["tag"])
    assert join(selection, [(7, "x"), (8, "y")], [1.0, 2.0]) == [
        {"id": 7, "tag": "x", "prediction": 1.0},
        {"id": 8, "tag": "y", "prediction": 2.0},
    ]


def test_join_groups_several_values_per_row() -> None:
    selection = Selection(key_column="id")
    assert join(selection, [(1,), (2,)], [0.1, 0.9, 0.7, 0.3]) == [
        {"id": 1, "prediction": [0.1, 0.9]},
        {"id": 2, "prediction": [0.7, 0.3]},
    ]


def test_join_without_carried_columns_leaves_the_predictions_alone() -> None:
    predictions = [1.0, 2.0]
    assert join(Selection(columns=["a"]), [(), ()], predictions) is predictions


def test_join_refuses_predictions_that_do_not_divide_among_the_rows() -> None:
    with pytest.raises(SelectionError, match=r"3 prediction\(s\) for 2 row\(s\)"):
        join(Selection(key_column="id"), [(1,), (2,)], [1.0, 2.0, 3.0])
