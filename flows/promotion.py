"""``models:/NAME@verified`` bound to the bytes its owner checked.

``privzo verify --promote`` (the ledger's owner) sets the alias on a version that passed every check and records,
in the ledger's ``privzo_promotions`` table (which only the owner writes; a worker and a viewer read it), the
version and the SHA-256 of every file of that version's model. MLflow lets whoever may register a model's
versions set its aliases and overwrite its artifacts, so neither the alias nor the bytes alone say what was
verified; ``load_verified`` (the consumer's loader) resolves the alias, checks that it names the promoted
version and that every file it downloads is the bytes promoted, and refuses in one line otherwise, before
anything is loaded. On the team's stack the MLflow door also keeps aliases to the promoters
(flows/mlflow_app.py)."""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import tempfile
from pathlib import Path
from typing import Dict, Optional

import mlflow
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

VERIFIED = "verified"


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


def record(ledger_url: str, name: str, version: str, run_id: str, digests: Dict[str, str],
           alias: str = VERIFIED) -> None:
    """The owner's record of a promotion (replacing the alias's earlier one)."""
    from flows.ledger import PrivacyLedger
    from flows.ledger.schema import PromotionRow

    with Session(PrivacyLedger.open(ledger_url).engine) as session, session.begin():
        session.execute(delete(PromotionRow).where(PromotionRow.model == name, PromotionRow.alias == alias))
        session.add(PromotionRow(model=name, alias=alias, version=str(version), run_id=run_id,
                                 digests=json.dumps(digests, sort_keys=True),
                                 promoted_at=dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)))


def withdraw(ledger_url: str, name: str, alias: str = VERIFIED) -> None:
    from flows.ledger import PrivacyLedger
    from flows.ledger.schema import PromotionRow

    with Session(PrivacyLedger.open(ledger_url).engine) as session, session.begin():
        session.execute(delete(PromotionRow).where(PromotionRow.model == name, PromotionRow.alias == alias))


def promoted(ledger_url: str, name: str, alias: str = VERIFIED):
    """The owner's record of ``alias`` on model ``name``, or None."""
    from sqlalchemy.exc import SQLAlchemyError

    from flows.ledger import PrivacyLedger
    from flows.ledger.schema import PromotionRow

    try:
        with Session(PrivacyLedger.open(ledger_url).engine) as session:
            return session.scalars(select(PromotionRow).where(PromotionRow.model == name,
                                                              PromotionRow.alias == alias)).first()
    except SQLAlchemyError:  # a ledger made before promotions were recorded holds none
        return None


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
    record_row = promoted(ledger_url, name, alias)
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
