"""propose_patch: apply fired rules to the config and to the user's own file, in two steps.

Deterministic, no LLM.

1. **Resolve** (:func:`resolve_changes`, ``changeset.py``, pure): each fired
   rule's ``fix.config`` assignments are evaluated (``"=expr"`` values over
   ``cores`` and the config) and applied in order of predicted uplift into
   one :class:`ChangeSet`; a later rule that assigns a field an earlier rule
   already set to a different value is dropped, and the set says which rule
   won and why.  The uplift and confidence formulas (DESIGN.md) are in the
   ``changeset`` module docstring.
2. **Write** (:func:`write_changes`): the change-set goes into the file, one
   :class:`~goblin_assets.patch.source_edit.SourceWriter` per format
   (:data:`WRITERS`).  A rule whose fields no writer can state is dropped
   with the reason (``cannot edit the file (...)``) and the set re-resolved
   without it (:meth:`ChangeSet.without`).

Writing a field into the file (:func:`edit_source`) uses what the parser
knows (``parse_config``'s readers, ``fields.py``):

* every place the file already writes the field (a YAML/JSON key, a keyword
  argument, an argparse default ...) is rewritten in place, in the key's own
  vocabulary (``config_map.render_value``: ``flash`` is
  ``"flash_attention_2"`` for ``attn_implementation``, a ``bf16`` flag
  becomes ``true`` and an ``fp16`` flag ``false``); only the value's source
  span changes, so comments and formatting stay;
* when no existing place states the new value, a key is added: YAML/JSON
  under the tool's own synonym (``fields.SYNONYMS``, skipping deprecated and
  version-gated keys), Python as a keyword of the right call
  (``fields.PY_INSERT``: ``attn_implementation=`` in the model's
  ``from_pretrained``, ``dataloader_num_workers=`` in ``TrainingArguments``)
  or as a statement after the imports (``torch.set_num_threads``);
* a value that needs more code gets it (the change-set's companion edits,
  ``fields.PY_VALUE_NEEDS``: dynamic padding needs a collator that pads each
  batch, passed to the Trainer);
* the patched text is read back with the same parser and every changed field
  must read as its new value, else :class:`PatchError`.

The diff is a unified diff with ``a/``/``b/`` prefixes relative to the
workload folder: ``git apply`` and ``patch -p1`` accept it there.
"""
from __future__ import annotations

import difflib
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from goblin_assets.config import fields as F
from goblin_assets.contracts import ConfigDict, Disagreement, KeywordEdit, Patch, RuleMatch, RunMetrics
from goblin_assets.errors import PatchError
from goblin_assets.host import keyword_names
from goblin_assets.kb.rules import KnowledgeBase
from goblin_assets.patch.changeset import (
    MAX_RECOVERABLE,
    ChangeSet,
    CompanionEdit,
    RuleDecision,
    companions_for,
    resolve_changes,
)
from goblin_assets.config.overrides import overriding_call, setting_call
from goblin_assets.patch.source_edit import Document, SourceWriter, TextWriter, installed_packages
from goblin_assets.patch.write_mapping import JsonWriter, YamlWriter
from goblin_assets.patch.write_python import PythonWriter

__all__ = ["MAX_RECOVERABLE", "WRITERS", "ChangeSet", "RuleDecision", "edit_source", "installed_packages",
           "propose_patch", "resolve_changes", "unified_diff", "write_changes"]

#: Writer per ``Document.kind``: a parsed Python script, YAML, JSON, or any other text (shell, launch line).
WRITERS: dict[str, Callable[[Document], SourceWriter]] = {
    "python": PythonWriter, "yaml": YamlWriter, "json": JsonWriter, "text": TextWriter,
}


#: Reads the keyword names of a dotted callable in the job's interpreter (None: it cannot be inspected).
Signatures = Callable[[str], "list[str] | None"]


def _write(config: ConfigDict, path: Path, changes: dict[str, Any], companions: list[CompanionEdit],
           packages: dict[str, str | None], keywords: list[KeywordEdit] = (),
           signatures: Signatures | None = None) -> tuple[str, str]:
    """(original, patched) text of ``path`` with ``changes``, their ``companions`` and ``keywords`` written.

    Raises PatchError for a file whose format the parser does not know
    (``source_format`` ``<syntax>:unknown``): no key of it is known to mean
    anything, so nothing is written into it (issue 17).  For a live audit's
    effective config, the file's own values and lines are edited
    (``ConfigDict.as_parsed``), and a field whose observed value disagrees
    with the file's (``ConfigDict.disagreements``) is refused with the
    finding: the value that wins is set where the parser cannot see, so
    editing the file's line would change nothing (issue 27).  A patchable
    disagreement (a literal statement of this file sets the run's value at
    run time, ``Disagreement.set_at``) is written in both places: the
    file's line and that statement.
    """
    blocked = {d.field: d for d in config.disagreements if not d.patchable}
    winning = {d.field: d for d in config.disagreements if d.patchable and d.set_at is not None}
    config = config.as_parsed()
    for fld in changes:
        if fld in blocked:
            d = blocked[fld]
            raise PatchError(f"{fld}: the run used {d.run_value!r}, not the file's {d.file_value!r} "
                             f"({d.file_where}): {d.cause}; no patch is written into the file's line")
    if config.source_format.rsplit(":", 1)[-1] in F.READ_ONLY_TOOLS:
        raise PatchError(f"{path.name}: Goblin reads {F.TOOL_NAMES[config.source_format.rsplit(':', 1)[-1]]} "
                         "files, but where a new value goes in them is unknown to its writers: no patch is written")
    if config.source_format.rsplit(":", 1)[-1] == "unknown":
        raise PatchError(f"{path.name}: Goblin does not know this file's format ({config.source_format}); "
                         "it writes no patch into a format it cannot read back")
    doc = Document.open(path, packages)
    writer = WRITERS[doc.kind](doc)
    for fld, value in changes.items():
        prov = config.provenance.get(fld)
        if prov is not None and prov.file and prov.kind != "unset" and Path(prov.file).name != path.name:
            raise PatchError(f"{fld} is set in {prov.file}, not in {path.name}; edit that file")
        wins = overriding_call(doc.read.tree, fld, value)
        if wins:
            raise PatchError(f"{wins}, which wins over the config: editing {fld} would change nothing")
        if fld in winning:
            _rewrite_setting(doc, writer, winning[fld], value, path)
        if not writer.rewrite(fld, value):
            writer.insert(fld, value)
        for edit in companions:
            if edit.field == fld:
                writer.companion(edit)
    for kw in keywords:
        writer.keyword_edit(kw, signatures or keyword_names)
    writer.finish()
    return doc.text.text, doc.patched(changes)


def _rewrite_setting(doc: Document, writer: SourceWriter, d: Disagreement, value: Any, path: Path) -> None:
    """Rewrite the statement that set ``d``'s run value (found again in ``doc``) to ``value``; PatchError if gone."""
    hit = setting_call(doc.read.tree, d.field, lambda v: v == d.run_value, path.name)
    if d.set_at is None or Path(d.set_at.file or "").name != path.name or hit is None or hit.span is None:
        raise PatchError(f"{d.field}: the statement that set the run's value {d.run_value!r} "
                         f"({d.set_at.detail if d.set_at else 'not found'}) is not in {path.name} as written")
    writer.rewrite_site(hit.conv, hit.span, value)


def edit_source(config: ConfigDict, changes: dict[str, Any], source: Path | None = None,
                packages: dict[str, str | None] | None = None) -> str:
    """The user's file (``source``, default ``config.source_file``) with ``changes`` applied.

    The writer for the file's format (:data:`WRITERS`) states each field and
    the companion edits its value needs (``changeset.companions_for``).

    Parameters
    ----------
    config : ConfigDict
        The parsed config (its provenance says which file each value came from).
    changes : dict
        ConfigDict field -> new value.
    source : Path, optional
        The parsed file (``config.source_file`` may be relative or redacted).
    packages : dict, optional
        Installed versions of version-gated libraries (default: this
        environment), to choose keys such as ``train_sampling_strategy``.

    Returns
    -------
    str
        The patched text; untouched lines, comments and formatting unchanged.

    Raises
    ------
    PatchError
        A field cannot be written in this file (no key, call or statement
        can carry it), its value lives in a companion file, or the patched
        text does not read back as the new values.
    """
    packages = installed_packages() if packages is None else packages
    return _write(config, Path(source or config.source_file), changes, companions_for(changes), packages)[1]


def unified_diff(original: str, patched: str, relpath: str) -> str:
    """A ``git apply``/``patch -p1`` compatible unified diff of one file."""
    out = "".join(difflib.unified_diff(
        original.splitlines(keepends=True), patched.splitlines(keepends=True),
        fromfile=f"a/{relpath}", tofile=f"b/{relpath}"))
    if out and not out.endswith("\n"):   # a last line without newline
        out += "\n\\ No newline at end of file\n"
    return out


def _writable(config: ConfigDict, cs: ChangeSet, src: Path, packages: dict[str, str | None],
              signatures: Signatures | None = None) -> ChangeSet:
    """``cs`` without the rules the file cannot carry, each dropped with the writer's reason.

    The applied rules are written cumulatively in uplift order (rule ``i``
    with the fields of the applied rules before it); the first that fails is
    excluded, the set re-resolved (the rules after it may now resolve
    differently) and the walk goes on from the same place.
    """
    done = 0
    while True:
        decisions = cs.outcomes("applied")
        for i in range(done, len(decisions)):
            if not decisions[i].fields and not cs.keyword_edits(decisions[i:i + 1]):
                continue        # env only: nothing to write into the file
            changes: dict[str, Any] = {}
            for d in decisions[:i + 1]:
                changes.update(d.fields)
            try:
                _write(config, src, changes, companions_for(changes), packages, cs.keyword_edits(decisions[:i + 1]),
                       signatures)
            except PatchError as exc:
                cs, done = cs.without({decisions[i].rule_id: f"cannot edit the file ({exc})"}), i
                break
        else:
            return cs


def write_changes(config: ConfigDict, change_set: ChangeSet, source: Path | None = None,
                  packages: dict[str, str | None] | None = None, workload_root: Path | None = None,
                  out_dir: Path | None = None, signatures: Signatures | None = None) -> Patch:
    """Write a resolved change-set into the user's file; return the Patch (step 2 of :func:`propose_patch`).

    Parameters
    ----------
    config : ConfigDict
        The parsed config the change-set was resolved from.
    change_set : ChangeSet
        From :func:`resolve_changes` (or ``ChangeSet.without``).
    source : Path, optional
        The parsed file (default ``config.source_file``).
    packages : dict, optional
        Installed library versions for version-gated keys (default: this
        environment's).
    workload_root : Path, optional
        The folder the diff's paths are relative to (default: the file's).
    out_dir : Path, optional
        When given, a copy of the workload folder with the patched file is
        written to ``out_dir/workload`` (``Patch.patched_file``).
    signatures : callable, optional
        Dotted callable -> its keyword names in the job's interpreter, for the
        rules' keyword edits (default :func:`goblin_assets.host.keyword_names`
        in this process's environment).

    Returns
    -------
    Patch
        The diff of every change the file can carry.  An applied rule whose
        fields no writer can state is dropped (``"<rule>: cannot edit the
        file (<why>)"``) and the set re-resolved without it; ``applied``,
        ``dropped``, ``env``, the speedups, the confidence and
        ``change_set`` (``ChangeSet.model_dump(mode="json")``) are those of
        the final set.

    Raises
    ------
    PatchError
        The file does not read back as the final changes (a writer bug).
    OSError
        The source file cannot be read, or ``out_dir`` cannot be written.
    """
    src = Path(source or config.source_file)
    packages = installed_packages() if packages is None else packages
    cs = _writable(config, change_set, src, packages, signatures)
    if cs.changes or cs.keyword_edits():
        original, patched = _write(config, src, cs.changes, cs.companions, packages, cs.keyword_edits(), signatures)
    else:
        original = patched = src.read_text(encoding="utf-8")
    root = workload_root or src.parent
    rel = src.resolve().relative_to(root.resolve()).as_posix()
    patch = Patch(
        new_config=cs.new_config, diff=unified_diff(original, patched, rel), target_file=str(src),
        applied=cs.applied, dropped=cs.dropped, env=cs.env, unset_env=cs.unset_env,
        expected_speedup_low=cs.expected_speedup_low, expected_speedup_high=cs.expected_speedup_high,
        confidence=cs.confidence, evidence_coverage=cs.evidence_coverage, rule_consistency=cs.rule_consistency,
        consistency_notes=cs.consistency_notes, change_set=cs.model_dump(mode="json"),
    )
    if out_dir is not None:
        copy = Path(out_dir) / "workload"
        if copy.exists():
            shutil.rmtree(copy)
        shutil.copytree(root, copy, ignore=shutil.ignore_patterns("__pycache__", ".git"))
        (copy / rel).write_text(patched, encoding="utf-8")
        patch.patched_file = str(copy / rel)
    return patch


def propose_patch(config: ConfigDict, kb: KnowledgeBase, matches: list[RuleMatch], metrics: RunMetrics,
                  cores: int, workload_root: Path | None = None, out_dir: Path | None = None,
                  source: Path | None = None, packages: dict[str, str | None] | None = None,
                  signatures: Signatures | None = None) -> Patch:
    """Apply the fired rules' transforms; return the Patch with its diff and predicted uplift.

    ``resolve_changes(config, kb, matches, metrics, cores)`` then
    ``write_changes(config, change_set, source, packages, workload_root, out_dir)``.

    Parameters
    ----------
    config, kb, matches, metrics
        The parsed config, the knowledge base, the rules checked on this run,
        and the profiled run (its waste budget weighs each rule).
    cores : int
        CPU cores of the job (the ``cores`` name in fix expressions).
    workload_root : Path, optional
        The folder the diff's paths are relative to (default: the file's).
    out_dir : Path, optional
        When given, a copy of the workload folder with the patched file is
        written to ``out_dir/workload`` (``Patch.patched_file``), so the
        patched run never touches the user's folder.
    source : Path, optional
        The parsed file (default ``config.source_file``, which the parser may
        store relative or redacted).
    packages : dict, optional
        Installed library versions for version-gated keys (default: this
        environment's).
    signatures : callable, optional
        As :func:`write_changes`.

    Returns
    -------
    Patch
        ``applied`` in order of predicted uplift, ``dropped`` with the reason
        per rule (a conflict names the winner and why), the diff against the
        user's file, ``expected_speedup_low/high`` and ``confidence``.

    Units
    -----
    ``AppliedRule.predicted_recovery`` is a share of the step time (0..1);
    speedups are ratios of throughput.

    Raises
    ------
    PatchError
        The source file cannot be read.
    """
    change_set = resolve_changes(config, kb, matches, metrics, cores)
    return write_changes(config, change_set, source, packages, workload_root, out_dir, signatures)
