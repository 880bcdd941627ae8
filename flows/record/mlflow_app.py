"""The team stack's MLflow server app (``mlflow server --app-name privzo-auth``): MLflow's basic-auth app,
and read-only users who write nothing.

basic-auth checks a user's permission on what exists (a run, an experiment, a registered model), but lets
any signed-in user create what has no owner yet: a new experiment or registered model, a gateway secret, a
demo experiment, a dataset. A viewer of the team's registry must write nothing at all, so the users named in
``PRIVZO_MLFLOW_READ_ONLY_USERS`` (comma separated; the stack names ``viewer``) are let through an allow-list
of reads only: GET and HEAD requests, the POST searches the UI and the client read with, and GraphQL (whose
only operations are reads). Anything else, including an endpoint a later MLflow adds, is refused: a
deny-list of writes would let every new write through. The allow-list holds at the ASGI door
(``ReadOnlyUsersAtTheDoor``), for the routes MLflow serves on FastAPI as well as the Flask app's.

The door decides by the user a request names, so it must read the same user MLflow will: MLflow's parsers are
lenient and not one (werkzeug's splits on whitespace and decodes base64 leniently; its FastAPI side reads
``X-MLflow-Authorization`` first on gateway routes). So the door admits only what it can parse exactly: every
``Authorization`` and ``X-MLflow-Authorization`` header a request carries must be the one canonical credential
``Basic <base64 of user:password>`` (strict base64 that re-encodes to itself, ASCII, no control character), the
same in each, naming a known user; anything else is refused (401) before MLflow sees the request.

What a name resolves to moves, and a record is removed, by a promoter only (``PRIVZO_MLFLOW_PROMOTERS``, where
the stack names them): basic-auth gives whoever may register a version its aliases, and whoever created a model,
run or experiment MANAGE over it (delete, rename). Registering a candidate needs none of that, so every route
that moves an alias, renames, moves a stage or deletes is refused to everyone else (``promoters_only``).

A logged byte never changes: MLflow's artifact proxy lets whoever may write a run overwrite or delete its
files in place, so a registered (even a promoted) version's weights could become other weights under the same
version and alias. At the door, for every user: an artifact that exists is never written again with other
bytes (a PUT of the same bytes, a client's retry, is answered as done), no multipart upload is opened or
completed over one, and no artifact is deleted.
"""
from __future__ import annotations

import base64
import hashlib
import os
import posixpath
import re
import tempfile
from pathlib import Path
from typing import Callable, Optional

READ_ONLY_ENV = "PRIVZO_MLFLOW_READ_ONLY_USERS"
# who may move a registered model's aliases, and remove or rename anything (the stack names admin, whose
# `privzo verify --promote` records what it promoted in the ledger, flows/record/promotion.py): basic-auth gives
# them to whoever may register a version, MANAGE to whoever created a model, run or experiment
PROMOTERS_ENV = "PRIVZO_MLFLOW_PROMOTERS"
# a route (its last segment) that moves what a name resolves to or removes a record, whatever it is named under
PROMOTER_ROUTES = frozenset({"alias", "rename", "transition-stage"})
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# the reads MLflow serves as POST (a search's filter is a body), named after /api/<version>/mlflow/ or
# /ajax-api/<version>/mlflow/
READ_POSTS = frozenset({
    "experiments/search", "runs/search", "logged-models/search", "traces/search", "datasets/search",
    "issues/search", "experiments/search-datasets", "prompt-optimization/jobs/search",
    "registered-models/get-latest-versions", "artifacts/presigned-download-url",
})
# MLflow's GraphQL has queries only (its "mutations" are searches); basic-auth checks what each one reads
READ_PATHS = frozenset({"/graphql"})
_API = re.compile(r"^/(?:ajax-)?api/\d+\.\d+/?mlflow/(?P<what>.+)$")


def read_only_users() -> frozenset:
    return frozenset(u.strip() for u in os.environ.get(READ_ONLY_ENV, "").split(",") if u.strip())


def is_read(method: str, path: str) -> bool:
    """Whether a request only reads: what a read-only user may send."""
    if method.upper() in READ_METHODS or path in READ_PATHS:
        return True
    api = _API.match(path)
    return method.upper() == "POST" and api is not None and api.group("what") in READ_POSTS


def promoters() -> frozenset:
    return frozenset(u.strip() for u in os.environ.get(PROMOTERS_ENV, "").split(",") if u.strip())


def promoters_only(method: str, path: str) -> bool:
    """Whether a request moves what a registered name resolves to, or removes or renames a record: an alias set
    or deleted, a model renamed, a stage moved, and any deletion (a version, a model, a run, an experiment, a
    logged model, a tag, traces, a webhook). Registering a candidate needs none of them; they are what makes
    ``models:/NAME@verified`` resolve to other bytes, or removes what verify and a consumer read."""
    api = _API.match(path)
    if method.upper() in READ_METHODS or api is None:
        return False
    last = api.group("what").rstrip("/").rsplit("/", 1)[-1]
    return method.upper() == "DELETE" or last.startswith("delete") or last in PROMOTER_ROUTES


def refused_to(user: Optional[str], method: str, path: str) -> bool:
    """A read-only user's write, or anyone but a promoter moving a name or removing a record (where promoters
    are named)."""
    if user in read_only_users() and not is_read(method, path):
        return True
    named = promoters()
    return bool(named) and user not in named and promoters_only(method, path)


def _read_only_users_write_nothing():
    from flask import g, request
    from mlflow.server.auth import make_forbidden_response

    # runs after basic-auth's own check, which has signed the user in (or refused the request)
    user = getattr(g, "mlflow_authenticated_user", None)
    if refused_to(user, request.method, request.path):
        return make_forbidden_response()
    return None


CREDENTIAL_HEADERS = (b"authorization", b"x-mlflow-authorization")
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")


class NotCanonical(ValueError):
    """A credential header the door cannot parse exactly as MLflow would (module docstring)."""


def basic_auth_user(headers) -> Optional[str]:
    """The user the request's credential headers name (the password is basic-auth's to check), None with no
    credential; ``NotCanonical`` for any header that is not the one canonical Basic credential, or two that
    differ."""
    values = [value for name, value in headers if name.lower() in CREDENTIAL_HEADERS]
    if not values:
        return None
    if len(set(values)) != 1:
        raise NotCanonical("two credential headers that differ")
    try:
        text = values[0].decode("ascii")
    except UnicodeDecodeError:
        raise NotCanonical("a credential that is not ASCII") from None
    scheme, _, token = text.partition(" ")
    if scheme != "Basic" or not token or not _BASE64.fullmatch(token) or len(token) % 4:
        raise NotCanonical("a credential that is not 'Basic <base64>'")
    decoded = base64.b64decode(token, validate=True)
    if base64.b64encode(decoded).decode("ascii") != token:
        raise NotCanonical("base64 that does not re-encode to itself")
    try:
        pair = decoded.decode("ascii")  # MLflow's FastAPI side decodes ASCII, werkzeug UTF-8: ASCII reads alike
    except UnicodeDecodeError:
        raise NotCanonical("a user or password that is not ASCII") from None
    user, colon, _ = pair.partition(":")
    if not colon or not user or any(ord(c) < 32 or ord(c) == 127 for c in pair):
        raise NotCanonical("no user:password pair")
    return user


class ReadOnlyUsersAtTheDoor:
    """ASGI middleware, outermost: a request naming a read-only user that is not a read is refused before any
    route sees it. MLflow serves some routers (jobs, gateway, assistant, MCP servers, artifacts) on FastAPI
    ahead of the Flask app, where the Flask hook below never runs; this holds for every route there is. A
    request naming a read-only user is refused by its name alone, before basic-auth checks the password:
    refusing a write to whoever claims that name costs nothing."""

    def __init__(self, app, known: Optional[Callable[[str], bool]] = None,
                 artifacts: Optional[ServedArtifacts] = None):
        # known: whether a user exists (basic-auth's store); artifacts: what the server serves, None if nothing
        self.app, self.known, self.artifacts = app, known, artifacts

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            try:
                user = basic_auth_user(scope.get("headers", ()))
            except NotCanonical:
                return await _refuse(send, 401, b"Credentials refused: give one canonical Basic credential")
            if user is not None and self.known is not None and not self.known(user):
                return await _refuse(send, 401, b"Credentials refused: unknown user")
            if refused_to(user, scope["method"], scope["path"]):
                return await _refuse(send, 403, b"Permission denied")
            written = artifact_written(scope["method"], scope["path"])
            # with a credential: MLflow refuses the others (401) before anything is written
            if written is not None and user is not None and self.artifacts is not None and \
                    await _artifact_refused(self.artifacts, scope["method"], written, receive, send):
                return
        await self.app(scope, receive, send)


_ARTIFACT = re.compile(r"^/(?:ajax-)?api/2\.0/mlflow-artifacts/(?P<route>artifacts|mpu/create|mpu/complete)/"
                       r"(?P<path>.+)$")


def artifact_written(method: str, path: str) -> Optional[str]:
    """The served artifact a request would write or delete (its path under the artifact root), else None."""
    match = _ARTIFACT.match(path)
    if match is None:
        return None
    wanted = ("PUT", "DELETE") if match.group("route") == "artifacts" else ("POST",)
    return match.group("path") if method.upper() in wanted else None


class ServedArtifacts:
    """The artifacts the server serves (``--artifacts-destination``), through MLflow's own repository for it."""

    def __init__(self, destination: Optional[str] = None):
        self.destination, self._repo = destination, None

    def repo(self):
        if self._repo is None:
            from mlflow.server import ARTIFACTS_DESTINATION_ENV_VAR
            from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

            self._repo = get_artifact_repository(self.destination or os.environ[ARTIFACTS_DESTINATION_ENV_VAR])
        return self._repo

    def exists(self, path: str) -> bool:
        parent = posixpath.dirname(path) or None
        try:
            return any(f.path == path and not f.is_dir for f in self.repo().list_artifacts(parent))
        except Exception:  # noqa: BLE001 - a folder that does not exist yet
            return False

    def digest(self, path: str) -> str:
        with tempfile.TemporaryDirectory() as tmp:
            return _sha256(Path(self.repo().download_artifacts(path, dst_path=tmp)))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


async def _body_digest(receive) -> str:
    h = hashlib.sha256()
    while True:
        message = await receive()
        h.update(message.get("body", b""))
        if not message.get("more_body"):
            return h.hexdigest()


async def _artifact_refused(artifacts: ServedArtifacts, method: str, path: str, receive, send) -> bool:
    """Whether the door answered a write to a served artifact itself (refused, or a same-bytes PUT done)."""
    from anyio import to_thread

    if method.upper() == "DELETE":
        await _refuse(send, 403, b"Permission denied: a logged artifact is never deleted")
        return True
    if not await to_thread.run_sync(artifacts.exists, path):
        return False
    if method.upper() == "PUT" and await _body_digest(receive) == await to_thread.run_sync(artifacts.digest, path):
        await _answer(send, 200, b"{}", b"application/json")  # what MLflow answers an upload
        return True
    await _refuse(send, 403, b"Permission denied: a logged artifact never changes")
    return True


async def _answer(send, status: int, body: bytes, kind: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", kind)]})
    await send({"type": "http.response.body", "body": body})


async def _refuse(send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"text/plain; charset=utf-8")]
    if status == 401:
        headers.append((b"www-authenticate", b'Basic realm="mlflow"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def create_app():
    from mlflow.server import app as flask_app
    from mlflow.server.auth import create_app as basic_auth_app

    flask_app.before_request(_read_only_users_write_nothing)
    # registered before basic-auth's hook would run first; Flask runs them in order, so move ours last
    hooks = flask_app.before_request_funcs.setdefault(None, [])
    served = basic_auth_app(flask_app)
    hooks.remove(_read_only_users_write_nothing)
    hooks.append(_read_only_users_write_nothing)
    if served is not flask_app:  # under uvicorn: a FastAPI app whose own routers come before Flask's
        from mlflow.server.auth import store

        from mlflow.server import ARTIFACTS_DESTINATION_ENV_VAR

        served_artifacts = ServedArtifacts() if os.environ.get(ARTIFACTS_DESTINATION_ENV_VAR) else None
        served.add_middleware(ReadOnlyUsersAtTheDoor, known=store.has_user, artifacts=served_artifacts)
    return served
