"""The ``graphjobs.graphrun.io`` CustomResourceDefinition, generated from the spec models.

The pydantic models of :mod:`graphrun.job.spec` are the one source of truth for the
spec, and :class:`graphrun.operator.status.GraphJobStatus` (a msgspec Struct) for the
status: their JSON Schemas are rewritten into a Kubernetes *structural* OpenAPI v3 schema
(every node typed, an ``enum`` of strings typed ``string``,
``$ref`` inlined, ``anyOf: [X, null]`` turned into ``nullable``, JSON-Schema-2020
``exclusiveMinimum: n`` into OpenAPI's ``minimum: n, exclusiveMinimum: true``, free-form
objects such as PodTemplateSpecs marked ``x-kubernetes-preserve-unknown-fields``).

``python -m graphrun.operator.crd`` prints the CRD as YAML (deploy/ holds a copy that a
test keeps equal to this output).
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import msgspec
import yaml

from graphrun.job.spec import (
    API_VERSION,
    JOB_NAME_MAX,
    JOB_NAME_PATTERN,
    KIND,
    graphjob_json_schema,
)
from graphrun.operator.status import GraphJobStatus
from graphrun.wire import schema_hook

GROUP, VERSION = API_VERSION.split("/")
PLURAL = "graphjobs"
SINGULAR = "graphjob"
CRD_NAME = f"{PLURAL}.{GROUP}"
SHORT_NAMES = ["gj"]

_KEEP = {
    "type",
    "description",
    "enum",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "format",
    "nullable",
}
PRESERVE = "x-kubernetes-preserve-unknown-fields"


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        rest = {k: v for k, v in node.items() if k != "$ref"}
        return {**target, **rest}
    return node


def structural(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """One JSON Schema node (pydantic output) as a structural OpenAPI v3 node."""
    node = _resolve(node, defs)
    if node.get(PRESERVE):
        out: dict[str, Any] = {PRESERVE: True}
        if node.get("type") == "object":
            out["type"] = "object"
        if "description" in node:
            out["description"] = inspect.cleandoc(node["description"])
        return out
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        nullable = len(options) < len(node["anyOf"])
        extra = {k: v for k, v in node.items() if k not in ("anyOf", "default", "title")}
        if len(options) != 1:
            return {PRESERVE: True, **({"nullable": True} if nullable else {})}
        inner = structural({**_resolve(options[0], defs), **extra}, defs)
        return {**inner, "nullable": True} if nullable else inner
    # copies: a definition used twice must not become a YAML alias
    out = {k: list(v) if isinstance(v, list) else v for k, v in node.items() if k in _KEEP}
    if isinstance(out.get("description"), str):  # a docstring as written: msgspec 0.23 no
        out["description"] = inspect.cleandoc(out["description"])  # longer cleans it
    if "enum" in node and "type" not in node and all(isinstance(v, str) for v in node["enum"]):
        out["type"] = "string"  # msgspec writes an Enum or a Literal untyped
    if "const" in node:
        out["enum"] = [node["const"]]
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if bound in node:
            out[plain] = node[bound]
            out[bound] = True
    if "properties" in node:
        out["properties"] = {k: structural(v, defs) for k, v in node["properties"].items()}
        if node.get("required"):
            out["required"] = list(node["required"])
    if isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = structural(node["additionalProperties"], defs)
    elif node.get("type") == "object" and "properties" not in node:
        out[PRESERVE] = True
    if "items" in node:
        out["items"] = structural(node["items"], defs)
    return out


def openapi_schema() -> dict[str, Any]:
    """The ``openAPIV3Schema`` of the GraphJob resource."""
    schema = graphjob_json_schema()
    defs = schema.get("$defs", {})
    spec = structural(schema["properties"]["spec"], defs)
    spec["x-kubernetes-validations"] = [IMMUTABLE_MANAGED_BY]
    return {
        "type": "object",
        "description": "A distributed GNN training job: partition, serve, sample, train.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {
                "type": "object",
                "properties": {
                    "name": {
                        "type": "string",
                        "maxLength": JOB_NAME_MAX,
                        "pattern": JOB_NAME_PATTERN,
                    }
                },
            },
            "spec": spec,
            "status": status_schema(),
        },
    }


def status_schema() -> dict[str, Any]:
    """The ``status`` schema, from :class:`GraphJobStatus`."""
    schema = msgspec.json.schema(GraphJobStatus, schema_hook=schema_hook)
    defs = schema["$defs"]
    out = structural(defs["GraphJobStatus"], defs)
    out["description"] = "Written by the operator (graphrun/operator/status.py)."
    return out


# spec.managedBy is fixed at creation, as in batch/v1 Job and JobSet: a job handed to
# another controller (MultiKueue) is never taken back, nor one of ours given away
IMMUTABLE_MANAGED_BY = {
    "rule": "has(self.managedBy) == has(oldSelf.managedBy) && "
    "(!has(self.managedBy) || self.managedBy == oldSelf.managedBy)",
    "message": "spec.managedBy is immutable",
}


PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Machines", "type": "integer", "jsonPath": ".spec.runtime.machines"},
    {"name": "Method", "type": "string", "jsonPath": ".spec.partition.method"},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts"},
    {"name": "Reason", "type": "string", "jsonPath": ".status.reason", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def graphjob_crd() -> dict[str, Any]:
    """The CustomResourceDefinition object (apiextensions.k8s.io/v1)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {"app.kubernetes.io/name": "graphrun"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "plural": PLURAL,
                "singular": SINGULAR,
                "kind": KIND,
                "listKind": f"{KIND}List",
                "shortNames": SHORT_NAMES,
                "categories": ["graphrun"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = (
        "# Generated by `python -m graphrun.operator.crd` from graphrun/job/spec/. Do not edit.\n"
    )
    return header + yaml.safe_dump(graphjob_crd(), sort_keys=False, width=100)


if __name__ == "__main__":
    sys.stdout.write(crd_yaml())
