"""DAG specs (contract §2): validation, import from YAML/JSON files, export back to YAML."""
