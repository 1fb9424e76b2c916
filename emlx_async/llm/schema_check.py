"""Whether a JSON schema allows any finite value: the check a grammar needs before llguidance.

A schema whose every value must hold another value of the same schema
(``{"$ref": "#"}`` alone, an object that requires a property of its own
type, ...) has no finite instance. llguidance compiles it, then fails at
the first token mask ("NoExtensionBias", or its parser's item limit), so
the error showed only once a request met the tokenizer. ``recursion_without_end``
finds it from the schema alone, so building the Grammar refuses it.

It is conservative: a part it cannot judge (a reference outside the
document, a keyword it does not model) counts as allowing a value, so it
never refuses a schema llguidance could serve.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

__all__ = ["recursion_without_end"]

def recursion_without_end(schema: Mapping[str, Any]) -> str | None:
    """None when `schema` allows some finite JSON value; otherwise why not, in words."""
    finite = _FiniteValues(schema)
    if finite.allows(schema):
        return None
    return ("every value it allows must contain another one through '$ref' without end; "
            "a recursive schema needs a way out (an optional property, an empty array, an anyOf branch)")


class _FiniteValues:
    """The least fixed point of "this (sub)schema has a finite value" over the
    references' targets: each starts as False and is re-judged until nothing changes,
    so a reference cycle with no way out stays False."""

    def __init__(self, root: Mapping[str, Any]):
        self.root = root
        self.targets: dict[int, Any] = {}      # id(target) -> target
        self.known: dict[int, bool] = {}       # id(target) -> finite value found so far
        self.changed = False

    def allows(self, schema: Any) -> bool:
        while True:
            self.changed = False
            result = self._judge(schema)
            for key, target in list(self.targets.items()):
                if not self.known[key] and self._judge(target):
                    self.known[key] = True
                    self.changed = True
            if not self.changed:
                return result

    def _judge(self, schema: Any) -> bool:
        if schema is False:
            return False
        if not isinstance(schema, Mapping):
            return True  # True, or something that is not a schema: not ours to refuse
        if "const" in schema or "enum" in schema:
            return True
        if "$ref" in schema and not self._reference_allows(schema["$ref"]):
            return False
        all_of = schema.get("allOf")
        if isinstance(all_of, list) and not all(self._judge(part) for part in all_of):
            return False
        for key in ("anyOf", "oneOf"):
            branches = schema.get(key)
            if isinstance(branches, list) and branches and not any(self._judge(part) for part in branches):
                return False
        types = schema.get("type")
        if types is None:
            return True  # a string is a value of any schema that does not name its types
        types = [types] if isinstance(types, str) else types
        if not isinstance(types, list):
            return True
        return any(self._type_allows(kind, schema) for kind in types)

    def _type_allows(self, kind: Any, schema: Mapping[str, Any]) -> bool:
        if kind == "object":
            properties = schema.get("properties")
            required = schema.get("required")
            if not isinstance(properties, Mapping) or not isinstance(required, list):
                return True
            return all(self._judge(properties[name]) for name in required
                       if isinstance(name, str) and name in properties)
        if kind == "array":
            least = schema.get("minItems", 0)
            if not isinstance(least, int) or least <= 0:
                return True
            prefix = schema.get("prefixItems")
            prefix = prefix if isinstance(prefix, list) else []
            if not all(self._judge(part) for part in prefix[:least]):
                return False
            return least <= len(prefix) or self._judge(schema.get("items", True))
        return True  # a scalar; an unknown type name is llguidance's to refuse

    def _reference_allows(self, reference: Any) -> bool:
        target = self._resolve(reference)
        if target is None:
            return True  # outside the document, or not found: llguidance reports that itself
        key = id(target)
        if key not in self.targets:
            self.targets[key], self.known[key] = target, False
            self.changed = True
        return self.known[key]

    def _resolve(self, reference: Any) -> Any:
        """The part of the document a local "#..." reference names (None: not local, or missing)."""
        if not isinstance(reference, str) or not reference.startswith("#"):
            return None
        pointer = unquote(reference[1:])
        node: Any = self.root
        if not pointer:
            return node
        if not pointer.startswith("/"):
            return None  # an anchor name ("#foo"): not modelled
        for token in pointer[1:].split("/"):
            token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping) and token in node:
                node = node[token]
            elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
                node = node[int(token)]
            else:
                return None
        return node
