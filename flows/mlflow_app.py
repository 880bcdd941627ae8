"""The team stack's MLflow server app (``mlflow server --app-name privzo-auth``): MLflow's basic-auth app,
and read-only users who create nothing.

basic-auth checks a user's permission on what exists (a run, an experiment, a registered model), but lets
any signed-in user create a new experiment or registered model, which that user then manages. A viewer of
the team's registry must not publish a model of its own beside the team's, so the users named in
``PRIVZO_MLFLOW_READ_ONLY_USERS`` (comma separated; the stack names ``viewer``) are refused those two
creations as well; everything else they are refused already (they hold READ on what others made).
"""
from __future__ import annotations

import os

READ_ONLY_ENV = "PRIVZO_MLFLOW_READ_ONLY_USERS"
# the creations basic-auth leaves to any signed-in user (REST and the UI's ajax API)
CREATIONS = frozenset(f"/{api}/2.0/mlflow/{what}/create" for api in ("api", "ajax-api")
                      for what in ("experiments", "registered-models"))


def read_only_users() -> frozenset:
    return frozenset(u.strip() for u in os.environ.get(READ_ONLY_ENV, "").split(",") if u.strip())


def _read_only_users_create_nothing():
    from flask import g, request
    from mlflow.server.auth import make_forbidden_response

    # runs after basic-auth's own check, which has signed the user in (or refused the request)
    user = getattr(g, "mlflow_authenticated_user", None)
    if request.path in CREATIONS and user in read_only_users():
        return make_forbidden_response()
    return None


def create_app():
    from mlflow.server import app as flask_app
    from mlflow.server.auth import create_app as basic_auth_app

    flask_app.before_request(_read_only_users_create_nothing)
    # registered before basic-auth's hook would run first; Flask runs them in order, so move ours last
    hooks = flask_app.before_request_funcs.setdefault(None, [])
    served = basic_auth_app(flask_app)
    hooks.remove(_read_only_users_create_nothing)
    hooks.append(_read_only_users_create_nothing)
    return served
