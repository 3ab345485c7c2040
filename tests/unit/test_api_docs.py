"""docs/api-reference.md is generated from crds/ and must match what the generator prints."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack.gen_api_docs import CRD_DIR, OUTPUT, generate, main, type_of, validation_of

pytestmark = pytest.mark.unit


def test_committed_api_reference_is_up_to_date() -> None:
    assert OUTPUT.read_text() == generate(CRD_DIR), (
        "docs/api-reference.md is out of date: run .venv/bin/python -m hack.gen_api_docs"
    )


def test_every_schema_field_has_a_row() -> None:
    text = generate(CRD_DIR)

    def paths(schema: dict[str, Any], prefix: str) -> Iterator[str]:
        for name, child in (schema.get("properties") or {}).items():
            yield f"{prefix}.{name}"
            yield from paths(child, f"{prefix}.{name}")

    for crd_path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.safe_load(crd_path.read_text())
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for section in ("spec", "status"):
            for path in paths(schema["properties"][section], section):
                if "[]" not in path:
                    assert f"| `{path}` |" in text, f"{crd_path.name}: {path} has no row"


def test_rows_say_what_the_api_server_enforces() -> None:
    text = generate(CRD_DIR)
    row = next(line for line in text.splitlines() if line.startswith("| `spec.configRef.name` |"))
    assert "| yes |" in row
    assert "length <= 253" in row
    assert "CEL: timeoutSeconds must be 0" in text
    assert "one of `None`, `DeleteOnSuccess`, `DeleteOnCompletion`" in text


def test_types_and_validations_are_rendered_readably() -> None:
    assert type_of({"type": "object", "additionalProperties": {"type": "string"}}) == (
        "map[string]string"
    )
    assert type_of({"type": "array", "items": {"type": "integer", "format": "int32"}}) == (
        "[]integer (int32)"
    )
    assert type_of({"x-kubernetes-int-or-string": True, "anyOf": []}) == "int or string"
    assert validation_of({"minimum": 0, "exclusiveMinimum": True, "pattern": "a|b"}) == (
        "> 0; pattern `a|b`"
    )
    assert validation_of({"pattern": "x" * 200}) == "a pattern (see the CRD)"


def test_check_mode_reports_a_stale_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = tmp_path / "api.md"
    stale.write_text("old\n")
    assert main(["--check", "--output", str(stale)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert main(["--output", str(stale)]) == 0
    assert main(["--check", "--output", str(stale)]) == 0


def test_a_directory_without_crds_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no CRDs"):
        generate(tmp_path)
