"""The team stack's MLflow users, made by its admin: ``worker`` (what the Prefect worker's flow runs log and
register as) and ``viewer`` (reads runs and models, writes nothing). Run by infra/local-stack.sh with
PRIVZO_STACK_AUTH=1 against a server started with ``--app-name basic-auth``; again on every start, so a
changed password in the environment takes effect. Passwords come from the environment, never from here.

With the server's ``default_permission = READ``, every signed-in user reads everything, and a user may
write only what it created (MLflow gives the creator MANAGE): the worker owns the experiments and
registered models its runs create, and the viewer owns nothing. The stack's door
(flows/record/mlflow_app.py) narrows that ownership: only the promoter moves an alias, renames or deletes.
"""
from __future__ import annotations

import os
import sys

USERS = {"worker": "PRIVZO_MLFLOW_WORKER_PASSWORD", "viewer": "PRIVZO_MLFLOW_VIEWER_PASSWORD"}


def main() -> int:
    from mlflow.exceptions import RestException
    from mlflow.server.auth.client import AuthServiceClient

    missing = [name for name in ("MLFLOW_TRACKING_URI", "PRIVZO_MLFLOW_ADMIN_PASSWORD", *USERS.values())
               if not os.environ.get(name)]
    if missing:
        print(f"mlflow_users: {missing[0]} is not set", file=sys.stderr)
        return 2
    # the admin signs in with the client's usual variables
    os.environ["MLFLOW_TRACKING_USERNAME"] = "admin"
    os.environ["MLFLOW_TRACKING_PASSWORD"] = os.environ["PRIVZO_MLFLOW_ADMIN_PASSWORD"]
    client = AuthServiceClient(os.environ["MLFLOW_TRACKING_URI"])
    for user, variable in USERS.items():
        password = os.environ[variable]
        try:
            client.create_user(user, password)
            print(f"made user {user}")
        except RestException as err:
            if err.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            client.update_user_password(user, password)
            print(f"user {user} exists: password set")
        client.update_user_admin(user, False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
