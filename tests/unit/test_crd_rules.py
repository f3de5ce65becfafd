"""A CEL rule of the CRD that asks `has(self.field)` of a field with a default also reads its value: the API server
fills in defaults before it evaluates the rules, so such a field always counts as set, and a rule that asks only
whether it is set always sees it set (seen: a changeSkewSeconds default of 60 made every table job without
changeColumn invalid)."""

import re

from embedjob.crd import crd

HAS = re.compile(r"has\(self((?:\.\w+)+)\)")


def _rules(node, where=""):
    """(path of the object, its schema, a rule's text) for every CEL rule in the schema."""
    if not isinstance(node, dict):
        return
    for rule in node.get("x-kubernetes-validations", []):
        yield where, node, rule["rule"]
    for name, child in (node.get("properties") or {}).items():
        yield from _rules(child, f"{where}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _rules(node["items"], f"{where}[]")


def _field(schema, path):
    for name in path:
        schema = (schema.get("properties") or {}).get(name)
        if schema is None:
            return None
    return schema


def test_no_rule_asks_only_whether_a_defaulted_field_is_set():
    root = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    asked = 0
    for where, schema, rule in _rules(root):
        if "oldSelf" in rule:  # the immutability rule compares has() of both versions: defaults are alike in both
            continue
        for match in HAS.finditer(rule):
            path = match.group(1).lstrip(".").split(".")
            field = _field(schema, path)
            assert field is not None, f"{where}: rule {rule!r} names {'.'.join(path)}, which the schema lacks"
            reads_value = re.search(rf"self{re.escape(match.group(1))}\b", HAS.sub("", rule)) is not None
            assert "default" not in field or reads_value, (
                f"{where}: rule {rule!r} asks only whether {'.'.join(path)} is set, and its default "
                f"({field['default']!r}) always sets it")
            asked += 1
    assert asked > 20  # the rules were found
