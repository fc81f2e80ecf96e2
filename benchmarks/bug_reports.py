"""Score ``goblin audit`` on the real-problem corpus (``tests/data/bug_reports/``), held-out third separately.

Each scenario folder rebuilds one public bug report or forum thread about slow
or broken fine-tuning in our own words: the reporter's config file in their
tool's format, a ``cached_metrics.json`` recording labelled ``modelled``, an
``environment.yaml`` of the reporter's machine and ``expected_findings.yaml``
(``must_fire``: the rules that name the cause and the fix; ``must_not_fire``:
changes that would hurt; ``source``: the issue's URL).  ``heldout.txt`` names
the third that was put aside at random (seed 16) before any rule was written
for the corpus; rules are never tuned on those.

For every scenario this runs the audit in process (``goblin_assets.cli.main``,
``goblin audit PATH --json``, the same code path as the command) and judges:

* **named**: every ``must_fire`` rule fired and was applied by the patch, or
  is reported as a hazard or warning (the report names the cause and the fix);
* **forbidden**: a ``must_not_fire`` rule was applied (a harmful change was
  proposed); a rule that fired but was blocked or dropped is not a change;
* **completed**: exit code 0 and a written report.

    .venv/bin/python benchmarks/bug_reports.py [--json] [--only NAME ...] [--without-invariants]

Prints one line per scenario and the scores of the training two-thirds, of
the held-out third and, on its own, of the held-aside third of the scenarios
added for the run-time invariant checks (``heldout_invariants.txt``, issue 28) and of the
scenarios added for the backward comparison and the warnings' remedies (``heldout_backward.txt``);
``--without-invariants`` scores copies whose recordings hold no invariant
checks (the baseline the checks improve).  Runs in a private ``GOBLIN_HOME`` (the audits' warehouse
rows do not land in yours).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "data" / "bug_reports"
HELDOUT_FILE = CORPUS / "heldout.txt"
HELDOUT_INVARIANTS_FILE = CORPUS / "heldout_invariants.txt"
HELDOUT_BACKWARD_FILE = CORPUS / "heldout_backward.txt"


def scenarios(root: Path = CORPUS) -> list[Path]:
    """The scenario folders (those with ``expected_findings.yaml``), sorted by name."""
    return sorted(p for p in root.iterdir() if (p / "expected_findings.yaml").is_file())


def _names(path: Path) -> set[str]:
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    return {ln.split("#")[0].strip() for ln in lines if ln.split("#")[0].strip()}


def heldout_invariants(root: Path = CORPUS) -> set[str]:
    """The held-aside third of the scenarios added for the run-time invariants (``heldout_invariants.txt``)."""
    return _names(root / HELDOUT_INVARIANTS_FILE.name)


def heldout_backward(root: Path = CORPUS) -> set[str]:
    """The held-aside third of the scenarios added for the backward comparison and the warnings' remedies
    (``heldout_backward.txt``, 2026-12-06)."""
    return _names(root / HELDOUT_BACKWARD_FILE.name)


def heldout(root: Path = CORPUS) -> set[str]:
    """Names of every held-out scenario (``heldout.txt``, ``heldout_invariants.txt`` and
    ``heldout_backward.txt``: one name a line, ``#`` comments)."""
    return _names(root / HELDOUT_FILE.name) | heldout_invariants(root) | heldout_backward(root)


def audit(folder: Path) -> tuple[int, dict[str, Any] | None, str]:
    """``goblin audit FOLDER --json`` in process: (exit code, the JSON object or None, stderr text)."""
    from goblin_assets.cli import main

    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        try:
            rc = main(["audit", str(folder), "--json"])
        except SystemExit as exc:  # argparse or a command that exits
            rc = int(exc.code or 0)
        except Exception as exc:  # noqa: BLE001 - a crash is a verdict, not a stop
            return 99, None, f"{type(exc).__name__}: {exc}"
    try:
        return rc, json.loads(buf.getvalue()), err.getvalue()
    except json.JSONDecodeError:
        return rc, None, err.getvalue()


def judge(folder: Path) -> dict[str, Any]:
    """One scenario's verdict: ``named``, ``missing``, ``forbidden``, ``completed`` and what the audit said."""
    spec = yaml.safe_load((folder / "expected_findings.yaml").read_text(encoding="utf-8"))
    rc, res, err = audit(folder)
    completed = rc == 0 and res is not None and Path(str(res.get("report_path"))).is_file()
    applied = set(res.get("rules", [])) if res else set()
    told = {h["rule_id"] for h in res.get("hazards", [])} if res else set()
    fired = set(res.get("fired_rules", [])) if res else set()
    if res and "failure" in res:  # a recording of a failed run: its report lists every rule that matches the failure
        told |= fired
    missing = [r for r in spec["must_fire"] if r not in applied | told]
    forbidden = [r for r in spec.get("must_not_fire", []) if r in applied]
    return {"name": folder.name, "source": spec.get("source", ""), "completed": completed, "rc": rc,
            "named": completed and not missing, "missing": missing, "forbidden": forbidden,
            "fired": sorted(fired), "applied": sorted(applied), "hazards": sorted(told),
            "dropped": res.get("dropped_rules", []) if res else [],
            "error": None if completed else (err.strip().splitlines() or ["no output"])[-1][:300]}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts of a group of verdicts: scenarios, named (cause and fix), with a forbidden change, completed."""
    n = len(rows)
    return {"scenarios": n, "named": sum(r["named"] for r in rows),
            "named_share": (sum(r["named"] for r in rows) / n) if n else None,
            "forbidden": sum(bool(r["forbidden"]) for r in rows), "completed": sum(r["completed"] for r in rows)}


def _without_invariants(folders: list[Path], dest: Path) -> list[Path]:
    """Copies of ``folders`` under ``dest`` whose recordings hold no run-time invariant checks (the baseline)."""
    import shutil

    out = []
    for f in folders:
        shutil.copytree(f, dest / f.name)
        rec = dest / f.name / "cached_metrics.json"
        data = json.loads(rec.read_text(encoding="utf-8"))
        data["invariants"] = None
        rec.write_text(json.dumps(data), encoding="utf-8")
        out.append(dest / f.name)
    return out


def run(only: list[str] | None = None, without_invariants: bool = False) -> dict[str, Any]:
    """Audit every scenario (or those named in ``only``) and return the verdicts and the scores: the training
    two-thirds, the held-out third, and the held-aside third of the invariant scenarios on its own.
    ``without_invariants`` audits copies whose recordings hold no invariant checks (what they add)."""
    held, held_inv, held_bwd = heldout(), heldout_invariants(), heldout_backward()
    folders = [f for f in scenarios() if not only or f.name in only]
    with tempfile.TemporaryDirectory(prefix="goblin-bugs-noinv-") as tmp:
        if without_invariants:
            folders = _without_invariants(folders, Path(tmp))
        rows = [judge(f) for f in folders]
    for r in rows:
        r["heldout"] = r["name"] in held
    return {"train": summary([r for r in rows if not r["heldout"]]),
            "heldout": summary([r for r in rows if r["heldout"] and r["name"] not in held_inv | held_bwd]),
            "heldout_invariants": summary([r for r in rows if r["name"] in held_inv]),
            "heldout_backward": summary([r for r in rows if r["name"] in held_bwd]), "scenarios": rows}


def _line(r: dict[str, Any]) -> str:
    mark = "ok " if r["named"] and not r["forbidden"] else "MISS" if r["completed"] else "FAIL"
    extra = []
    if r["missing"]:
        extra.append(f"missing {', '.join(r['missing'])}")
    if r["forbidden"]:
        extra.append(f"FORBIDDEN {', '.join(r['forbidden'])}")
    if r["error"]:
        extra.append(f"error: {r['error']}")
    return f"{mark:4s} {'H' if r['heldout'] else ' '} {r['name']:48s} {'; '.join(extra)}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    ap.add_argument("--only", nargs="*", help="scenario names to audit (default: all)")
    ap.add_argument("--without-invariants", action="store_true",
                    help="audit copies whose recordings hold no run-time invariant checks (the baseline they improve)")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="goblin-bugs-") as home:
        os.environ["GOBLIN_HOME"] = home
        res = run(args.only, args.without_invariants)
    if args.json:
        sys.stdout.write(json.dumps(res, indent=2) + "\n")
        return 0
    for r in res["scenarios"]:
        print(_line(r))
    for label in ("train", "heldout", "heldout_invariants", "heldout_backward"):
        s = res[label]
        share = f"{s['named_share']:.0%}" if s["named_share"] is not None else "n/a"
        print(f"{label:18s}: cause and fix named {s['named']}/{s['scenarios']} ({share}); forbidden change proposed "
              f"in {s['forbidden']}; audit completed {s['completed']}/{s['scenarios']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
