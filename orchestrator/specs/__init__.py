"""DAG specs: validation, import from YAML/JSON files, export back to YAML."""
