"""The knowledge base: the cited rules and their matching against a run (``rules``), and the
hybrid semantic search over them (``retrieval``).  The rules themselves are data, in the
repository's top-level ``kb/`` folder (package ``goblin_assets.kb.data``)."""
