"""``models:/NAME@verified`` bound to the bytes its owner checked.

``privzo verify --promote`` (the ledger's owner) sets the alias on a version that passed every check and records,
in the ledger's ``privzo_promotions`` table (which only the owner writes; a worker and a viewer read it), the
version and the SHA-256 of every file of that version's model. MLflow lets whoever may register a model's
versions set its aliases and overwrite its artifacts, so neither the alias nor the bytes alone say what was
verified; ``load_verified`` (the consumer's loader) resolves the alias, checks that it names the promoted
version and that every file it downloads is the bytes promoted, and refuses in one line otherwise, before
anything is loaded. On the team's stack the MLflow door also keeps aliases to the promoters
(flows/record/mlflow_app.py)."""
from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Optional

import mlflow

from flows.ledger.promotions import VERIFIED, promoted, record, withdraw
from flows.record.verify_report import NOT_APPLICABLE, VerifyReport

if TYPE_CHECKING:
    from flows.ledger import PrivacyLedger


class NotVerified(ValueError):
    """A load of ``@verified`` that is not the bytes its owner promoted."""


def folder_digests(folder: Path) -> Dict[str, str]:
    """SHA-256 of every file under ``folder``, by its path relative to it."""
    out = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        out[path.relative_to(folder).as_posix()] = digest.hexdigest()
    return out


def _downloaded(uri: str, name: str, version: str, into: Path) -> Path:
    """The version's model files from the tracking server at ``uri``, its registry named explicitly (a models:/
    URI would resolve against the process's registry URI, which need not be ``uri``)."""
    from mlflow.artifacts import download_artifacts

    client = mlflow.MlflowClient(uri, registry_uri=uri)
    source = client.get_model_version_download_uri(name, version)
    if source.startswith("models:/"):  # a logged model (models:/m-...): its own artifact location
        source = client.get_logged_model(source.removeprefix("models:/").split("/")[0]).artifact_location
    return Path(download_artifacts(artifact_uri=source, dst_path=str(into), tracking_uri=uri))


def version_digests(uri: str, name: str, version: str) -> Dict[str, str]:
    """SHA-256 of every file of model ``name`` version ``version`` as the tracking server at ``uri`` serves it."""
    with tempfile.TemporaryDirectory(prefix="privzo-promote-") as folder:
        return folder_digests(_downloaded(uri, name, version, Path(folder)))


def load_verified(name: str, *, ledger_url: str, tracking_uri: Optional[str] = None, alias: str = VERIFIED,
                  flavor: str = "pyfunc"):
    """``models:/NAME@verified`` loaded only if it is the version and the bytes the ledger's owner promoted
    (``flavor``: pyfunc, or pytorch for the module); ``NotVerified`` in one line otherwise."""
    from flows.ledger import shown_url
    from specs.sections.tracking import tracking_uri_from_env

    uri = tracking_uri or tracking_uri_from_env()
    client = mlflow.MlflowClient(uri, registry_uri=uri)
    try:
        current = client.get_model_version_by_alias(name, alias)
    except Exception:  # noqa: BLE001 - no such model or alias
        raise NotVerified(f"models:/{name}@{alias}: no such alias in {uri}") from None
    from flows.ledger import PrivacyLedger

    record_row = promoted(PrivacyLedger.open(ledger_url), name, alias)  # the consumer's entry: its one open
    if record_row is None:
        raise NotVerified(f"models:/{name}@{alias}: the ledger {shown_url(ledger_url)} records no promotion of it; "
                          f"its owner promotes a version with `privzo verify {name} VERSION --promote`")
    if str(current.version) != record_row.version:
        raise NotVerified(f"models:/{name}@{alias} names version {current.version}, but its owner promoted version "
                          f"{record_row.version}: the alias was moved outside `privzo verify --promote`; not loaded")
    expected = json.loads(record_row.digests)
    with tempfile.TemporaryDirectory(prefix="privzo-load-") as folder:
        local = _downloaded(uri, name, str(current.version), Path(folder))
        found = folder_digests(local)
        changed = sorted(p for p in set(expected) | set(found) if expected.get(p) != found.get(p))
        if changed:
            raise NotVerified(f"models:/{name}@{alias} (version {current.version}): {changed[0]} is not the bytes its "
                              f"owner verified and promoted ({len(changed)} file{'s' if len(changed) != 1 else ''} "
                              "differ); not loaded")
        if flavor == "pytorch":
            return mlflow.pytorch.load_model(str(local))
        return mlflow.pyfunc.load_model(str(local))


def promote(report: VerifyReport, tracking_uri: Optional[str], ledger: "PrivacyLedger") -> str:
    """``privzo verify --promote``: set or remove the ``verified`` alias as ``report`` says, recording the
    promotion (or its withdrawal) in the ledger first; the line that tells which."""
    from specs.sections.tracking import tracking_uri_from_env

    uri = tracking_uri or tracking_uri_from_env()
    client = mlflow.MlflowClient(uri)
    name, number = report.model_name, report.version
    if report.passed and report.complete:
        # the bytes checked, recorded where only the owner writes, before the alias names them
        digests = version_digests(uri, name, number)
        record(ledger, name, number, report.run_id or "", digests)
        client.set_registered_model_alias(name, VERIFIED, number)
        return (f"promoted: models:/{name}@{VERIFIED} is version {number} ({len(digests)} files recorded; "
                "flows.record.promotion.load_verified loads only these bytes)")
    held = client.get_registered_model(name).aliases.get(VERIFIED)
    holds_it = held is not None and str(held) == str(number)
    if holds_it:
        withdraw(ledger, name)
    if report.passed:  # a check that could not run for this spec is not a pass to promote on
        skipped = next(c for c in report.checks if c.status == NOT_APPLICABLE)
        if holds_it:
            client.delete_registered_model_alias(name, VERIFIED)
        return (f"not promoted: version {number} passed what could be checked, but its {skipped.name} check could "
                f"not run ({skipped.detail}); {VERIFIED!r} means every check ran and passed, so a spec without "
                "a journal of its whole trajectory (two_point with sgd) is never promoted")
    if holds_it:
        client.delete_registered_model_alias(name, VERIFIED)
        return f"not promoted: version {number} lost the {VERIFIED!r} alias (models:/{name}@{VERIFIED} is unset)"
    return (f"not promoted: version {number} does not get the {VERIFIED!r} alias"
            + (f" (it stays on version {held})" if held is not None else ""))
