"""Validates a JSON file against a JSON Schema (python3-jsonschema), and
checks that the schema itself is valid. Exit 0 when it conforms."""
import json
import sys

import jsonschema


def main(schema_path, *files):
    schema = json.load(open(schema_path))
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    validator = validator_class(schema)
    bad = 0
    for path in files:
        doc = json.load(open(path))
        errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
        for e in errors[:10]:
            print(f"{path}: {'/'.join(map(str, e.path)) or '(root)'}: {e.message}")
        bad += bool(errors)
        if not errors:
            print(f"{path}: conforms to {schema_path}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
