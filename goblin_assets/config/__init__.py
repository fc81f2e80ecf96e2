"""Reading a training setup: Python scripts (read with ``ast``), JSON, YAML, TOML and launch lines,
into one ConfigDict with the provenance of every field (``parse.parse_config``)."""
