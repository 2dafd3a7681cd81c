"""The versioned JSON Schemas of the bridge protocol (bindings/schema/v1) and validation.

Loads every schema file into one `referencing` registry, so cross-file `$ref`s resolve without
any network access, and checks method params (and, in tests, results and notifications) with
`jsonschema`'s Draft 2020-12 validator. Owns no method logic.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from specsteer.bridge.errors import INVALID_PARAMS, BridgeError

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


def check_params(method: str, params: Any) -> dict[str, Any]:
    """`params` when they match the method's schema; else an INVALID_PARAMS error naming why."""
    errors = sorted(validator(method, "params").iter_errors(params), key=lambda e: list(e.path))
    if errors:
        first = errors[0]
        where = "params" + "".join(f"[{p!r}]" for p in first.absolute_path)
        raise BridgeError(INVALID_PARAMS, f"{where}: {first.message}",
                          errors=[_describe(e) for e in errors[:10]])
    return params


def _describe(error: Any) -> dict[str, Any]:
    return {"path": list(error.absolute_path), "message": error.message}
