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
"""
from __future__ import annotations

import base64
import os
import re
from typing import Optional

READ_ONLY_ENV = "PRIVZO_MLFLOW_READ_ONLY_USERS"
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


def _read_only_users_write_nothing():
    from flask import g, request
    from mlflow.server.auth import make_forbidden_response

    # runs after basic-auth's own check, which has signed the user in (or refused the request)
    user = getattr(g, "mlflow_authenticated_user", None)
    if user in read_only_users() and not is_read(request.method, request.path):
        return make_forbidden_response()
    return None


def basic_auth_user(headers) -> Optional[str]:
    """The user an HTTP Basic ``Authorization`` header names (its password is basic-auth's to check), or None."""
    for name, value in headers:
        if name.lower() == b"authorization":
            kind, _, token = value.decode("latin-1").partition(" ")
            if kind.lower() != "basic":
                return None
            try:
                return base64.b64decode(token.strip(), validate=True).decode("utf-8").partition(":")[0]
            except (ValueError, UnicodeDecodeError):
                return None
    return None


class ReadOnlyUsersAtTheDoor:
    """ASGI middleware, outermost: a request naming a read-only user that is not a read is refused before any
    route sees it. MLflow serves some routers (jobs, gateway, assistant, MCP servers, artifacts) on FastAPI
    ahead of the Flask app, where the Flask hook below never runs; this holds for every route there is. A
    request naming a read-only user is refused by its name alone, before basic-auth checks the password:
    refusing a write to whoever claims that name costs nothing."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and basic_auth_user(scope.get("headers", ())) in read_only_users() \
                and not is_read(scope["method"], scope["path"]):
            await send({"type": "http.response.start", "status": 403,
                        "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
            await send({"type": "http.response.body", "body": b"Permission denied"})
            return
        await self.app(scope, receive, send)


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
        served.add_middleware(ReadOnlyUsersAtTheDoor)
    return served
