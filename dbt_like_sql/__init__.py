"""The SQL models as data: ``staging/`` views and ``marts/`` tables over the warehouse.

Installed as the package ``goblin_assets.dbt_like_sql`` (``setup.py`` maps this folder
there); ``goblin_assets.warehouse.sql_models`` reads them with ``importlib.resources``.
"""
