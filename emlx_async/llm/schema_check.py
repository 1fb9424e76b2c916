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
    try:
        if _FiniteValues(schema).allows(schema):
            return None
    except RecursionError:  # nested past Python's stack: not judged here (llguidance has its own limits)
        return None
    return ("every value it allows must contain another one through '$ref' without end; "
            "a recursive schema needs a way out (an optional property, an empty array, an anyOf branch)")


class _FiniteValues:
    """The least fixed point of "this (sub)schema has a finite value" over the references'
    targets, found as a grammar's productive symbols are: each target starts False and is
    judged again only when a target it refers to turns True, so a reference cycle with no
    way out stays False, and each target is judged at most once per reference it holds."""

    def __init__(self, root: Mapping[str, Any]):
        self.root = root
        self.targets: dict[int, Any] = {}                # id(target) -> target
        self.known: dict[int, bool] = {}                 # id(target) -> a finite value found
        self.dependents: dict[int, set[int]] = {}        # id(target) -> the targets that refer to it
        self._pending: list[int] = []                    # targets to judge (again)
        self._judging: int | None = None                 # the target being judged (None: the root)
        self._resolved: dict[str, Any] = {}              # reference -> its target (None: none)

    def allows(self, schema: Any) -> bool:
        self._judge(schema)  # finds the targets the root refers to
        while self._pending:
            key = self._pending.pop()
            if self.known[key]:
                continue
            self._judging = key
            if self._judge(self.targets[key]):
                self.known[key] = True
                self._pending.extend(k for k in self.dependents[key] if not self.known[k])
        self._judging = None
        return self._judge(schema)

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
        if not isinstance(reference, str):
            return True
        if reference not in self._resolved:
            self._resolved[reference] = self._resolve(reference)
        target = self._resolved[reference]
        if target is None:
            return True  # outside the document, or not found: llguidance reports that itself
        key = id(target)
        if key not in self.targets:
            self.targets[key], self.known[key], self.dependents[key] = target, False, set()
            self._pending.append(key)
        if self._judging is not None:
            self.dependents[key].add(self._judging)
        return self.known[key]

    def _resolve(self, reference: str) -> Any:
        """The part of the document a local "#..." reference names (None: not local, or missing)."""
        if not reference.startswith("#"):
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
