"""The knowledge base as data: the cited rules (``rocm_rules.yaml``), the run-signal
pattern table (``signals.yaml``) and the search phrases (``phrases.yaml``).

Installed as the package ``goblin_assets.kb.data`` (``setup.py`` maps this folder there),
so the code reads it with ``importlib.resources.files("goblin_assets.kb.data")`` from any
directory, in an editable install and from a built wheel alike.
"""
