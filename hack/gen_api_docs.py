"""Generate docs/api-reference.md from the CRDs in crds/.

    python -m hack.gen_api_docs           # rewrite docs/api-reference.md
    python -m hack.gen_api_docs --check   # exit 1 if it is out of date

The CRD schemas are the single source of truth: every field's type, whether it
is required, its default, its validation (OpenAPI and CEL, by their messages)
and its description come from them. tests/unit/test_api_docs.py fails when the
committed page differs from what this prints.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
CRD_DIR = REPO / "crds"
OUTPUT = REPO / "docs" / "api-reference.md"

# Patterns longer than this are described, not printed, to keep tables readable.
MAX_PATTERN = 70

Schema = Mapping[str, Any]


@dataclass(frozen=True)
class Field:
    path: str
    type: str
    required: bool
    default: str
    validation: str
    description: str


def load_crds(crd_dir: Path) -> list[dict[str, Any]]:
    """Every CustomResourceDefinition in ``crd_dir``, ordered by kind."""
    crds = []
    for path in sorted(crd_dir.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            if doc.get("kind") != "CustomResourceDefinition":
                raise ValueError(
                    f"{path}: expected a CustomResourceDefinition, got {doc.get('kind')}"
                )
            crds.append(doc)
    if not crds:
        raise ValueError(f"no CRDs in {crd_dir}")
    return sorted(crds, key=lambda crd: str(crd["spec"]["names"]["kind"]))


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return _one_line(text).replace("|", "\\|")


def _code(text: str) -> str:
    return f"`{text}`"


def type_of(schema: Schema) -> str:
    if schema.get("x-kubernetes-int-or-string"):
        return "int or string"
    kind = schema.get("type")
    if kind is None and "anyOf" in schema:
        return " or ".join(str(option.get("type")) for option in schema["anyOf"])
    if kind == "array":
        return f"[]{type_of(schema.get('items', {}))}"
    if kind == "object":
        values = schema.get("additionalProperties")
        if isinstance(values, Mapping):
            return f"map[string]{type_of(values)}"
        if schema.get("x-kubernetes-preserve-unknown-fields") and not schema.get("properties"):
            return "object (free-form)"
        return "object"
    if kind is None:
        return "any"
    fmt = schema.get("format")
    return f"{kind} ({fmt})" if fmt else str(kind)


def validation_of(schema: Schema) -> str:
    rules: list[str] = []
    if "enum" in schema:
        rules.append("one of " + ", ".join(_code(str(v)) for v in schema["enum"]))
    for key, word in (("minimum", ">="), ("maximum", "<=")):
        if key in schema:
            exclusive = schema.get(f"exclusive{key[0].upper()}{key[1:]}") is True
            rules.append(f"{word.rstrip('=') if exclusive else word} {schema[key]}")
    for key, word in (("minLength", "length >="), ("maxLength", "length <=")):
        if key in schema:
            rules.append(f"{word} {schema[key]}")
    for key, word in (("minItems", "items >="), ("maxItems", "items <=")):
        if key in schema:
            rules.append(f"{word} {schema[key]}")
    pattern = schema.get("pattern")
    if pattern:
        rules.append(
            f"pattern {_code(pattern)}"
            if len(pattern) <= MAX_PATTERN
            else "a pattern (see the CRD)"
        )
    for rule in schema.get("x-kubernetes-validations") or []:
        message = rule.get("message") or rule.get("messageExpression") or rule["rule"]
        rules.append(f"CEL: {_one_line(message)}")
    if schema.get("x-kubernetes-list-type") == "map":
        keys = ", ".join(schema.get("x-kubernetes-list-map-keys") or [])
        rules.append(f"list keyed by {keys}")
    return "; ".join(rules)


def default_of(schema: Schema) -> str:
    if "default" not in schema:
        return ""
    value = schema["default"]
    return _code(value if isinstance(value, str) else json.dumps(value))


def walk(schema: Schema, path: str, required: bool) -> Iterator[Field]:
    """One Field for ``schema`` at ``path``, then for everything under it."""
    yield Field(
        path=path,
        type=type_of(schema),
        required=required,
        default=default_of(schema),
        validation=validation_of(schema),
        description=_one_line(schema.get("description", "")),
    )
    needed = set(schema.get("required") or [])
    for name, child in (schema.get("properties") or {}).items():
        yield from walk(child, f"{path}.{name}", name in needed)
    values = schema.get("additionalProperties")
    if isinstance(values, Mapping) and values.get("properties"):
        yield from walk(values, f"{path}.<key>", False)
    items = schema.get("items")
    if isinstance(items, Mapping) and items.get("properties"):
        needed_items = set(items.get("required") or [])
        for name, child in items["properties"].items():
            yield from walk(child, f"{path}[].{name}", name in needed_items)


def field_table(fields: Sequence[Field]) -> list[str]:
    lines = [
        "| Field | Type | Required | Default | Validation | Description |",
        "|---|---|---|---|---|---|",
    ]
    for f in fields:
        lines.append(
            f"| {_code(f.path)} | {_cell(f.type)} | {'yes' if f.required else ''} "
            f"| {_cell(f.default)} | {_cell(f.validation)} | {_cell(f.description)} |"
        )
    return lines


def render_crd(crd: Mapping[str, Any]) -> list[str]:
    spec = crd["spec"]
    names = spec["names"]
    lines = [f"## {names['kind']}", ""]
    (version,) = [v for v in spec["versions"] if v.get("storage")]
    schema = version["schema"]["openAPIV3Schema"]
    if schema.get("description"):
        lines += [_one_line(schema["description"]), ""]
    served = ", ".join(v["name"] for v in spec["versions"] if v.get("served"))
    subresources = ", ".join(sorted(version.get("subresources") or {})) or "none"
    lines += [
        "| | |",
        "|---|---|",
        f"| API version | `{spec['group']}/{version['name']}` (served: {served}) |",
        f"| Scope | {spec['scope']} |",
        f"| Resource | `{names['plural']}` (singular `{names['singular']}`, list "
        f"`{names.get('listKind', names['kind'] + 'List')}`) |",
        f"| Short names | {', '.join(_code(n) for n in names.get('shortNames') or []) or 'none'} |",
        f"| Categories | {', '.join(_code(c) for c in names.get('categories') or []) or 'none'} |",
        f"| Subresources | {subresources} |",
        "",
    ]
    columns = version.get("additionalPrinterColumns") or []
    if columns:
        lines += [
            "### Printer columns",
            "",
            "`kubectl get` shows the columns of priority 0; `-o wide` adds the others.",
            "",
            "| Column | Type | JSONPath | Priority | Description |",
            "|---|---|---|---|---|",
        ]
        for column in columns:
            lines.append(
                f"| {column['name']} | {column['type']} | {_code(column['jsonPath'])} "
                f"| {column.get('priority', 0)} | {_cell(column.get('description', ''))} |"
            )
        lines.append("")
    properties = schema.get("properties") or {}
    top_required = set(schema.get("required") or [])
    for section in ("spec", "status"):
        if section not in properties:
            continue
        lines += [f"### {section}", ""]
        lines += field_table(list(walk(properties[section], section, section in top_required)))
        lines.append("")
    return lines


def render(crds: Sequence[Mapping[str, Any]]) -> str:
    lines = [
        "<!-- Generated by `python -m hack.gen_api_docs` from crds/. Do not edit by hand. -->",
        "",
        "# API reference",
        "",
        "The custom resources of group `ai.krateo.io`, generated from the CRD schemas in "
        "`crds/` (the same files the Helm chart installs). A field is *required* when its "
        "parent is present; *Validation* lists what the API server enforces (OpenAPI and CEL "
        "rules, by their messages), so `kubectl apply` refuses what breaks it.",
        "",
    ]
    lines += [
        f"- [{crd['spec']['names']['kind']}](#{crd['spec']['names']['kind'].lower()})"
        for crd in crds
    ]
    lines.append("")
    for crd in crds:
        lines += render_crd(crd)
    return "\n".join(lines).rstrip("\n") + "\n"


def generate(crd_dir: Path = CRD_DIR) -> str:
    return render(load_crds(crd_dir))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hack.gen_api_docs", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--check", action="store_true", help="fail if the page is out of date")
    parser.add_argument("--crds", type=Path, default=CRD_DIR, help="CRD directory")
    parser.add_argument("--output", type=Path, default=OUTPUT, help="Markdown file to write")
    args = parser.parse_args(argv)
    text = generate(args.crds)
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current == text:
            return 0
        sys.stdout.writelines(
            difflib.unified_diff(
                current.splitlines(keepends=True),
                text.splitlines(keepends=True),
                str(args.output),
                "generated",
            )
        )
        print(f"\n{args.output} is out of date: run python -m hack.gen_api_docs", file=sys.stderr)
        return 1
    args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
