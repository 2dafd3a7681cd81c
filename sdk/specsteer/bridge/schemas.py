"""The versioned JSON Schemas of the bridge protocol (bindings/schema/v1) and validation.

Loads every schema file into one `referencing` registry, so cross-file `$ref`s resolve without
any network access, and checks method params (and, in tests, results and notifications) with
`jsonschema`'s Draft 2020-12 validator; and that every string in them is text (a JSON escape can
carry a lone surrogate, which no schema type refuses and nothing can encode). Owns no method
logic.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from specsteer.bridge.errors import INVALID_PARAMS, BridgeError
from specsteer.tokenizer import check_text

PROTOCOL_VERSION = 1
SCHEMA_DIR = Path(__file__).resolve().parent / "schema" / f"v{PROTOCOL_VERSION}"
BASE_URI = f"https://specsteer.invalid/schema/bridge/v{PROTOCOL_VERSION}/"


def _libraries() -> tuple[Any, Any]:
    try:
        import jsonschema
        import referencing
    except ModuleNotFoundError as exc:  # the bridge extra is not installed
        raise SystemExit(
            "specsteer bridge needs the jsonschema package: pip install 'specsteer[bridge]'"
        ) from exc
    return jsonschema, referencing


@cache
def _registry() -> Any:
    _, referencing = _libraries()
    resources = []
    for path in sorted(SCHEMA_DIR.glob("*.json")):
        document = json.loads(path.read_text(encoding="utf-8"))
        resources.append((document["$id"], referencing.Resource.from_contents(document)))
    if not resources:
        raise SystemExit(f"the bridge protocol schemas are missing from {SCHEMA_DIR}")
    return referencing.Registry().with_resources(resources)


def schema_names() -> list[str]:
    """Every method and notification with a schema file (common and error excluded)."""
    return sorted(p.stem for p in SCHEMA_DIR.glob("*.json") if p.stem not in ("common", "error"))


@cache
def validator(name: str, part: str) -> Any:
    """A validator of `part` ("params", "result", "data") of method or notification `name`."""
    jsonschema, _ = _libraries()
    schema = {"$ref": f"{BASE_URI}{name}.json#/$defs/{part}"}
    return jsonschema.Draft202012Validator(schema, registry=_registry())


def check_text_members(value: Any, where: str = "params") -> None:
    """Raise INVALID_PARAMS naming the first string (or object key) of parsed JSON `value` that
    is not valid Unicode text."""
    if isinstance(value, str):
        try:
            check_text(value, where)
        except ValueError as exc:
            raise BridgeError(INVALID_PARAMS, str(exc)) from None
    elif isinstance(value, dict):
        for key, member in value.items():
            check_text_members(key, f"{where}: a key")
            check_text_members(member, f"{where}[{key!r}]")
    elif isinstance(value, list):
        for index, member in enumerate(value):
            check_text_members(member, f"{where}[{index}]")


def check_params(method: str, params: Any) -> dict[str, Any]:
    """`params` when they match the method's schema and hold only text; else an INVALID_PARAMS
    error naming why."""
    check_text_members(params)
    problems = _problems(method, params)
    if problems:
        first = problems[0]
        where = "params" + "".join(f"[{p!r}]" for p in first["path"])
        raise BridgeError(INVALID_PARAMS, f"{where}: {first['message']}", errors=problems[:10])
    return params


def _problems(method: str, params: Any) -> list[dict[str, Any]]:
    """Every error, outermost first. Params made of shared parts (`allOf` of common.json's
    `request` and `decoding_options`) are closed by `unevaluatedProperties`, which also
    reports a member whose own value is wrong (a part that fails evaluates nothing): that
    error is replaced by one naming only the members the method does not declare."""
    found, unknown = [], []
    for error in validator(method, "params").iter_errors(params):
        if error.validator == "unevaluatedProperties" and not error.path:
            declared = declared_members(method)
            unknown = [name for name in error.instance if name not in declared]
        else:
            found.append(_describe(error))
    if unknown:
        listed = ", ".join(repr(name) for name in unknown)
        found.append({"path": [], "message": f"Additional properties are not allowed ({listed} "
                      f"{'was' if len(unknown) == 1 else 'were'} unexpected)"})
    unique = {repr(problem): problem for problem in found}  # each part refuses a non-object
    return sorted(unique.values(), key=lambda problem: problem["path"])


@cache
def declared_members(method: str) -> frozenset[str]:
    """The names the params of `method` declare: its own and those of the parts it composes."""
    resolver = _registry().resolver(base_uri=f"{BASE_URI}{method}.json")
    names: set[str] = set()

    def walk(resolved: Any) -> None:
        schema = resolved.contents
        names.update(schema.get("properties", {}))
        for part in schema.get("allOf", []):
            if "$ref" in part:
                walk(resolved.resolver.lookup(part["$ref"]))
            else:
                names.update(part.get("properties", {}))

    walk(resolver.lookup("#/$defs/params"))
    return frozenset(names)


def _describe(error: Any) -> dict[str, Any]:
    """An error as {path, message}. A value no branch of an `anyOf`/`oneOf` accepts is
    described by the branch of its own type (`'' should be non-empty`, not `'' is not valid
    under any of the given schemas`), or by the types it may have when none is its own."""
    if error.context:
        same_type = [e for e in error.context if not (e.validator == "type" and not e.path)]
        if same_type:
            return _describe(min(same_type, key=lambda e: len(e.path)))
        types = " or ".join(repr(e.validator_value) for e in error.context)
        return {"path": list(error.absolute_path),
                "message": f"{error.instance!r} is not of type {types}"}
    if error.validator == "pattern" and "description" in error.schema:  # not the regex
        return {"path": list(error.absolute_path),
                "message": f"{error.instance!r} is not {error.schema['description']}"}
    return {"path": list(error.absolute_path), "message": error.message}
