"""Validates a JSON file against a JSON Schema (python3-jsonschema), and
checks that the schema itself is valid. The file must be strict JSON: NaN and
Infinity, which Python's json module accepts by default, are refused. Exit 0
when it conforms."""
import json
import sys

import jsonschema


def refuse(constant):
    raise ValueError(f"{constant} is not JSON")


def main(schema_path, *files):
    schema = json.load(open(schema_path))
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    validator = validator_class(schema)
    bad = 0
    for path in files:
        doc = json.load(open(path), parse_constant=refuse)
        errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
        for e in errors[:10]:
            print(f"{path}: {'/'.join(map(str, e.path)) or '(root)'}: {e.message}")
        bad += bool(errors)
        if not errors:
            print(f"{path}: conforms to {schema_path}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
