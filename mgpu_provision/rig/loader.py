"""Load a rig file: safe YAML with positions, the models, the cross-field rules, and every problem at once.

A rig file's errors are the first thing a user meets, so each one names file:line:column, the field and what
was expected, and all of them come at once: the rules also run on the parts of a file that failed the schema
(`_salvage`), so that schema and rule errors are reported together.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from ..catalog.topology import TopoMatrix
from ..errors import SpecError, SpecProblem
from .files import read_topologies
from .inventory_part import InventoryPart, read_inventory_part
from .messages import field_name, schema_findings, unwrap
from .models import Cdi, DcgmDiag, Host, ImexDomain, NodeCheck, Rig, RigFile
from .plain import plain
from .rig import LoadedRig, SectionDefaults
from .rules import Finding, Loc, RuleInput, check_rules
from .source import Rejected, parse, read_text

__all__ = ["LoadedRig", "load_rig"]


def load_rig(path: str | Path) -> LoadedRig:
    """Read, check and return a rig file; raise SpecError carrying every problem found."""
    path = Path(path)
    shown = str(path)
    try:
        data, source, yaml_problems = parse(read_text(path))
    except Rejected as exc:
        pos = exc.position
        raise SpecError(
            [SpecProblem(shown, exc.message, pos.line if pos else None, pos.column if pos else None)]
        ) from None
    problems = [
        SpecProblem(shown, message, pos.line, pos.column, field_name(loc) or None)
        for loc, pos, message in yaml_problems
    ]
    base_dir = path.resolve().parent
    findings: list[tuple[Finding, bool]] = []  # (finding, is it a "missing key" pointing at the parent)
    spec: RigFile | None = None
    try:
        spec = RigFile.model_validate(data)
    except ValidationError as exc:
        findings.extend(schema_findings(exc.errors(), source))
    part = read_inventory_part(data, base_dir)
    for problem in part.problems:
        if problem.file is not None:
            problems.append(SpecProblem(problem.file, problem.message, problem.line))
        else:
            findings.append((Finding(problem.loc, problem.message, problem.at_key), False))
    rule_findings, topologies = _rule_findings(data, spec, base_dir, part)
    findings.extend((f, False) for f in rule_findings)
    findings = _dedented(data, findings)
    # A refused tag or merge key already explains why the value under it is missing or wrong.
    explained = [loc for loc, _, _ in yaml_problems]
    findings = [(f, m) for f, m in findings if not any(f.loc[: len(loc)] == loc for loc in explained)]
    for finding, missing in findings:
        if missing:
            parent = source.nearest(finding.loc[:-1])
            pos = source.keys.get(parent) or source.values[parent]
        else:
            pos = source.position(finding.loc, at_key=finding.at_key)
        problems.append(SpecProblem(shown, finding.message, pos.line, pos.column, field_name(finding.loc)))
    if problems:
        # The rig file's problems first, then those of the inventory and its variable files.
        problems.sort(key=lambda p: (p.file != shown, p.file, p.line or 0, p.column or 0))
        raise SpecError(problems)
    assert spec is not None  # no problems means the schema validated
    if part.hosts:
        spec = spec.model_copy(update={"hosts": [*spec.hosts, *part.hosts]})
    parsed = {name: found for name, found in topologies.items() if not isinstance(found, str)}
    # Validated: from here on plain values (rig/plain.py), which the rig cache keeps without pydantic.
    defaults = SectionDefaults(
        node_check=plain(NodeCheck()),
        cdi=plain(Cdi()),
        dcgm_diag=plain(DcgmDiag()),
        imex_domain=plain(ImexDomain()),
    )
    return LoadedRig(path=path, base_dir=base_dir, spec=plain(spec), defaults=defaults, topologies=parsed)


M = TypeVar("M", bound=BaseModel)


def _salvage(model: type[M], raw: object, loc: Loc, left_out: list[Loc]) -> M | None:
    """Validate `raw`; when that fails, salvage what can be: failed nested models are salvaged in turn,
    other failed keys are dropped if optional. Gives up (None) when a required key cannot be saved.

    Whatever had to be left out is added to `left_out`, so that the rules stay quiet about it.
    """
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        failed = {error["loc"][0] for error in exc.errors() if error["loc"]}
    if not isinstance(raw, dict):
        left_out.append(loc)
        return None
    kept = dict(raw)
    for key in failed:
        info = model.model_fields.get(str(key))
        inner = unwrap(info.annotation) if info is not None else None
        if key in raw and isinstance(inner, type) and issubclass(inner, BaseModel):
            saved = _salvage(inner, raw[key], (*loc, key), left_out)
            if saved is not None:
                kept[key] = saved
                continue
        if info is not None and key in raw:
            entries = _salvage_entries(Annotated[info.annotation, info], raw[key], (*loc, key), left_out)
            if entries is not None:
                kept[key] = entries
                continue
        if info is not None and info.is_required():
            left_out.append(loc)
            return None
        kept.pop(key, None)
        left_out.append((*loc, key))
    try:
        return model.model_validate(kept)
    except ValidationError:  # a cross-field validator that needs what was dropped
        left_out.append(loc)
        return None


def _salvage_section(name: str, raw: object, left_out: list[Loc]) -> Any:
    annotation = unwrap(RigFile.model_fields[name].annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _salvage(annotation, raw, (name,), left_out)
    info = RigFile.model_fields[name]
    annotated: Any = Annotated[info.annotation, info]  # the field's type with its constraints
    try:
        return TypeAdapter(annotated).validate_python(raw)
    except ValidationError:
        entries = _salvage_entries(annotated, raw, (name,), left_out)
        if entries is None:
            left_out.append((name,))
        return entries


def _salvage_entries(annotated: Any, raw: object, loc: Loc, left_out: list[Loc]) -> dict[str, Any] | None:
    """A map (`env`, `path_prepend`) that failed as a whole, entry by entry: the entries that validate alone
    are kept for the rules (a bad name beside `PATH: $PATH:...` must not hide that value's own problem),
    the others left out. None when `raw` is no map of such entries."""
    if not isinstance(raw, dict) or typing.get_origin(unwrap(annotated)) is not dict:
        return None
    adapter: TypeAdapter[Any] = TypeAdapter(annotated)
    kept: dict[str, Any] = {}
    for key, value in raw.items():
        try:
            kept.update(adapter.validate_python({key: value}))
        except ValidationError:
            left_out.append((*loc, key))
    return kept


def _rule_findings(
    data: dict[str, object], spec: RigFile | None, base_dir: Path, part: InventoryPart
) -> tuple[list[Finding], dict[str, TopoMatrix | str]]:
    """Rule findings, also for a file with schema errors: rules see the parts that did validate; and the
    rigs' topology files as read (once) for the rules and the loaded rig.

    Findings inside a left-out part are dropped: its schema errors already describe it.
    """
    raw_hosts = data.get("hosts") if isinstance(data.get("hosts"), list) else []
    raw_rigs = data.get("rigs") if isinstance(data.get("rigs"), dict) else {}
    assert isinstance(raw_hosts, list) and isinstance(raw_rigs, dict)
    declared_hosts = frozenset(
        item["name"] for item in raw_hosts if isinstance(item, dict) and isinstance(item.get("name"), str)
    ) | {host.name for host in part.hosts}
    declared_rigs = frozenset(name for name in raw_rigs if isinstance(name, str))
    left_out: list[Loc] = []
    if spec is None:
        hosts = [(i, _salvage(Host, raw, ("hosts", i), left_out)) for i, raw in enumerate(raw_hosts)]
        rigs = {name: _salvage(Rig, raw, ("rigs", name), left_out) for name, raw in raw_rigs.items()}
        sections: dict[str, Any] = {
            name: _salvage_section(name, data[name], left_out)
            for name in RigFile.model_fields.keys() - {"hosts", "rigs"}
            if name in data
        }
        spec = RigFile.model_construct(
            hosts=[host for _, host in hosts if host is not None],
            rigs={name: rig for name, rig in rigs.items() if rig is not None},
            **{name: value for name, value in sections.items() if value is not None},
        )
        host_index: tuple[Loc, ...] = tuple(("hosts", i) for i, host in hosts if host is not None)
    else:
        host_index = tuple(("hosts", i) for i in range(len(spec.hosts)))
    spec = spec.model_copy(update={"hosts": [*spec.hosts, *part.hosts]})
    host_index += tuple(("rig_groups", group) for group in part.groups)
    topologies = read_topologies(spec.rigs.items(), base_dir)
    inp = RuleInput(
        spec, host_index, declared_hosts, declared_rigs, base_dir, topologies, hosts_known=part.readable
    )
    # A finding inside a left-out part, or about a part that lost a child, may only echo the schema error.
    findings = [f for f in check_rules(inp) if not any(_echoes(f, part) for part in left_out)]
    return findings, topologies


def _echoes(finding: Finding, part: Loc) -> bool:
    """Whether `finding` may only echo the schema error of the left-out `part`: it lies inside it or above
    it, or beside it and names it (a misspelt `bridge.kind` reads as its default, so a rule says "`pairs`
    needs an NVLink bridge kind; bridge.kind is none" about a value the user never wrote)."""
    if _related(finding.loc, part):
        return True
    key = part[-1] if part else None
    beside = len(finding.loc) >= len(part) and finding.loc[: len(part) - 1] == part[:-1]
    named = isinstance(key, str) and re.search(rf"\b{re.escape(key)}\b", finding.message) is not None
    return beside and named


def _dedented(data: dict[str, object], findings: list[tuple[Finding, bool]]) -> list[tuple[Finding, bool]]:
    """A rig's own key (`bridge:`, `driver:`) written one level too far left reads as a rig type of that
    name, with a problem for each of its keys: one line that says what happened instead."""
    rigs = data.get("rigs")
    sections = [key for key in (rigs if isinstance(rigs, dict) else {}) if key in Rig.model_fields]
    kept = [(f, m) for f, m in findings if not any(f.loc[:2] == ("rigs", key) for key in sections)]
    for key in sections:
        message = f"'{key}' is a key of a rig, not a rig type: indented one level too far left?"
        kept.append((Finding(("rigs", key), message, at_key=True), False))
    return kept


def _related(a: Loc, b: Loc) -> bool:
    shorter = min(len(a), len(b))
    return a[:shorter] == b[:shorter]
