"""The MLflow app's read-only users: an allow-list of reads, checked against every endpoint MLflow serves, so
a write a later MLflow adds is refused until someone lists it as a read."""
import pytest

from flows.mlflow_app import READ_POSTS, is_read


def _endpoints():
    from mlflow.server.handlers import get_endpoints

    return [(path, method) for path, _handler, methods in get_endpoints() for method in methods]


def test_every_endpoint_that_writes_is_refused_to_a_read_only_user():
    writes = [(p, m) for p, m in _endpoints() if is_read(m, p) and m not in ("GET", "HEAD", "OPTIONS")]
    # the POSTs let through are the listed searches (and GraphQL's reads), nothing that creates or changes
    assert writes and all(p == "/graphql" or p.rsplit("mlflow/", 1)[1] in READ_POSTS for p, _ in writes)
    for path in ("/api/3.0/mlflow/gateway/secrets/create", "/ajax-api/3.0/mlflow/demo/generate",
                 "/api/2.0/mlflow/experiments/create", "/ajax-api/2.0/mlflow/registered-models/create",
                 "/api/2.0/mlflow/model-versions/set-tag", "/api/3.0/mlflow/datasets/create"):
        assert not is_read("POST", path), path
    assert not is_read("DELETE", "/api/2.0/mlflow/registered-models/delete")
    assert not is_read("PATCH", "/api/2.0/mlflow/model-versions/update")
    assert not is_read("PUT", "/api/2.0/mlflow-artifacts/artifacts/x")


@pytest.mark.parametrize("what", sorted(READ_POSTS))
def test_each_listed_read_is_a_post_mlflow_serves(what):
    served = {p.rsplit("mlflow/", 1)[1] for p, m in _endpoints() if m == "POST" and "mlflow/" in p}
    assert what in served
    assert is_read("POST", f"/api/2.0/mlflow/{what}") and is_read("POST", f"/ajax-api/3.0/mlflow/{what}")


def test_a_read_only_user_is_refused_at_the_asgi_door_on_every_route(monkeypatch):
    """MLflow serves jobs, the assistant, MCP servers and the gateway on FastAPI ahead of Flask, where the Flask
    hook never ran: the middleware refuses a viewer's write there too, and lets reads and other users by."""
    import asyncio
    import base64

    from flows.mlflow_app import ReadOnlyUsersAtTheDoor

    reached, sent = [], []

    async def inner(scope, receive, send):
        reached.append((scope["method"], scope["path"]))

    async def send(message):
        sent.append(message)

    def call(user, method, path):
        headers = [(b"authorization", b"Basic " + base64.b64encode(f"{user}:pw".encode()))]
        sent.clear()
        asyncio.run(ReadOnlyUsersAtTheDoor(inner)({"type": "http", "method": method, "path": path,
                                                   "headers": headers}, None, send))
        return sent[0]["status"] if sent else None

    monkeypatch.setenv("PRIVZO_MLFLOW_READ_ONLY_USERS", "viewer")
    for method, path in (("POST", "/ajax-api/3.0/mlflow/mcp-servers"), ("PUT", "/ajax-api/3.0/mlflow/assistant/config"),
                         ("POST", "/ajax-api/3.0/jobs/"), ("POST", "/api/3.0/mlflow/gateway/secrets/create")):
        assert call("viewer", method, path) == 403, path
        assert call("worker", method, path) is None  # basic-auth decides for other users
    assert call("viewer", "GET", "/ajax-api/3.0/mlflow/assistant/config") is None
    assert call("viewer", "POST", "/api/2.0/mlflow/runs/search") is None
    assert reached.count(("PUT", "/ajax-api/3.0/mlflow/assistant/config")) == 1  # the worker's only
