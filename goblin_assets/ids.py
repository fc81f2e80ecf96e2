"""Ids of audits and recorded traces: one scheme for every front door."""
from __future__ import annotations

import uuid


def make_audit_id(workload: str, token: str | None = None) -> str:
    """The id of one audit: ``<workload with / as ->-<first 8 characters of token>``.

    ``token`` is the Dagster run id for an audit materialized in Dagster, a
    fresh random hex string otherwise.  Every row an audit writes carries this
    id (``audit_id``) or a run id derived from it (``<audit_id>-profile``,
    ``-patched``, ``-sketch``).
    """
    return f"{workload.replace('/', '-')}-{(token or uuid.uuid4().hex)[:8]}"
