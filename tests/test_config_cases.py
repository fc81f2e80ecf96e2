"""Every config case (shared/cases/configs and tests/data/configs) parses to its expected values."""
from __future__ import annotations

import io
import json
import math
import time
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from goblin_assets.audit.config import config_to_json, parse_config, render_config_table
from goblin_assets.contracts import CONFIG_FIELDS

SHARED_CASES = Path(__file__).resolve().parents[1].parent / "shared" / "cases" / "configs"
LOCAL_CASES = Path(__file__).resolve().parent / "data" / "configs"


def _cases() -> list:
    params = []
    for root in (SHARED_CASES, LOCAL_CASES):
        if not root.is_dir():
            continue
        for case in sorted(p for p in root.iterdir() if (p / "expected.yaml").is_file()):
            params.append(pytest.param(case, id=f"{root.parent.parent.name}/{case.name}"))
    if not SHARED_CASES.is_dir():
        params.append(pytest.param(None, id="shared-cases-missing", marks=pytest.mark.skip(
            reason=f"shared config cases not found at {SHARED_CASES} (../shared beside the repo)")))
    return params


def _same(got, want) -> bool:
    if isinstance(want, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        return math.isclose(got, want, rel_tol=1e-9)
    return got == want and type(got) is type(want) if want is not None else got is None


def _table_text(cfg) -> str:
    console = Console(record=True, width=400, file=io.StringIO())
    console.print(render_config_table(cfg))
    return console.export_text()


@pytest.mark.parametrize("case", _cases())
def test_case(case: Path):
    spec = yaml.safe_load((case / "expected.yaml").read_text())
    start = time.perf_counter()
    cfg = parse_config(case / spec["entry"])
    assert time.perf_counter() - start < 2.0

    wrong = {k: (v, getattr(cfg, k)) for k, v in spec.get("expected", {}).items() if not _same(getattr(cfg, k), v)}
    assert not wrong, f"(expected, got): {wrong}\n" + "\n".join(
        f"{k}: {cfg.provenance[k]}" for k in wrong)

    # Every field has a provenance; null values say why; literal spans hold the value's text.
    assert set(cfg.provenance) == set(CONFIG_FIELDS)
    for name in CONFIG_FIELDS:
        prov = cfg.provenance[name]
        value = getattr(cfg, name)
        if value is None:
            assert prov.kind == "unset" and prov.detail, (name, prov)
        else:
            assert prov.kind != "unset", (name, prov)
        if prov.span is not None:
            _check_span(case, prov, value)

    for needle in spec.get("warnings_contain", []):
        assert any(needle in w for w in cfg.warnings), (needle, cfg.warnings)

    doc = json.dumps(config_to_json(cfg))
    shown = "\n".join([doc, cfg.raw_source, _table_text(cfg), cfg.source_file])
    for secret in spec.get("absent_from_output", []):
        assert secret not in shown, secret


def _check_span(case: Path, prov, value) -> None:
    """The span's text is the value's source text (numbers compare numerically)."""
    lines = (case / prov.file).read_text().split("\n")
    l0, c0, l1, c1 = prov.span
    assert 1 <= l0 <= l1 <= len(lines)
    text = lines[l0 - 1][c0:c1] if l0 == l1 else lines[l0 - 1][c0:]
    assert text.strip(), prov
    literal = text.strip("\"'")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            number = float(literal)
        except ValueError:
            return  # an expression such as `5 * 4` or `GLOBAL_BATCH // MICRO_BATCH`
        assert math.isclose(number, value), (prov, text, value)
    elif isinstance(value, str) and prov.kind in ("literal", "default", "env") and "/" in value:
        assert literal == value, (prov, text, value)


def test_json_contract_keys():
    """`goblin parse --json`: field names at the top level, plus provenance and warnings."""
    case = SHARED_CASES / "c01_trainer_literals" / "train.py"
    if not case.exists():
        case = LOCAL_CASES / "c17_raw_loop_patterns" / "train.py"
    doc = config_to_json(parse_config(case))
    assert set(CONFIG_FIELDS) <= set(doc)
    assert set(doc["provenance"]) == set(CONFIG_FIELDS)
    assert isinstance(doc["warnings"], list)
    json.dumps(doc)
    for prov in doc["provenance"].values():
        assert set(prov) >= {"file", "line", "kind", "detail", "span"}
