"""Reads a JUnit XML file as a CI dashboard would: validates it against
schemas/junit.xsd (python3-lxml) and checks that every count attribute
(tests, failures, errors, skipped, on each suite and on the whole) equals the
elements it counts. Prints the totals; exit 0 when it is sound."""
import sys

from lxml import etree


def counts(cases):
    kinds = {"failures": "failure", "errors": "error", "skipped": "skipped"}
    got = {"tests": len(cases)}
    for attribute, child in kinds.items():
        got[attribute] = sum(1 for c in cases if c.find(child) is not None)
    return got


def main(schema_path, path, *expect):
    schema = etree.XMLSchema(etree.parse(schema_path))
    doc = etree.parse(path)
    if not schema.validate(doc):
        for e in schema.error_log:
            print(f"{path}:{e.line}: {e.message}")
        return 1
    root = doc.getroot()
    bad = 0
    every = []
    for suite in root.findall("testsuite"):
        cases = suite.findall("testcase")
        every += cases
        for attribute, value in counts(cases).items():
            if int(suite.get(attribute)) != value:
                print(f"{path}: suite {suite.get('name')}: {attribute}={suite.get(attribute)}, but it holds {value}")
                bad += 1
    totals = counts(every)
    for attribute, value in totals.items():
        if int(root.get(attribute)) != value:
            print(f"{path}: testsuites: {attribute}={root.get(attribute)}, but it holds {value}")
            bad += 1
    # Expected totals from the caller, e.g. failures>=1 errors=1.
    for condition in expect:
        for op in (">=", "="):
            if op in condition:
                name, value = condition.split(op)
                ok = totals[name] >= int(value) if op == ">=" else totals[name] == int(value)
                if not ok:
                    print(f"{path}: expected {condition}, found {name}={totals[name]}")
                    bad += 1
                break
    if bad:
        return 1
    print(f"{path}: conforms to {schema_path}: " + ", ".join(f"{k}={v}" for k, v in totals.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
