"""The MLflow app's read-only users: an allow-list of reads, checked against every endpoint MLflow serves, so
a write a later MLflow adds is refused until someone lists it as a read."""
import base64
import pytest

from flows.record.mlflow_app import READ_POSTS, is_read


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

    from flows.record.mlflow_app import ReadOnlyUsersAtTheDoor

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


MALFORMED = {
    "a dot inside the base64": lambda t: b"Basic " + t[:4] + b"." + t[4:],
    "a tab after Basic": lambda t: b"Basic\t" + t,
    "two spaces": lambda t: b"Basic  " + t,
    "lowercase scheme": lambda t: b"basic " + t,
    "padding dropped": lambda t: b"Basic " + t.rstrip(b"="),
    "trailing space": lambda t: b"Basic " + t + b" ",
    "a newline inside": lambda t: b"Basic " + t[:4] + b"\n" + t[4:],
    "base64url alphabet": lambda t: b"Basic " + t.replace(b"+", b"-").replace(b"/", b"_"),
    "not ASCII": lambda t: b"Basic " + t + "\u00e9".encode("latin-1"),
    "no colon": lambda t: b"Basic " + base64.b64encode(b"viewer"),
    "a control character": lambda t: b"Basic " + base64.b64encode(b"viewer\x00:pw"),
    "utf-8 user": lambda t: b"Basic " + base64.b64encode("vi\u00e9wer:pw".encode()),
    "empty": lambda t: b"",
    "Bearer": lambda t: b"Bearer " + t,
}


def _mlflow_users(value: bytes, path: str):
    """The users MLflow's own two parsers read from an ``Authorization`` header (werkzeug's for Flask, and its
    FastAPI routes', with authentication stubbed to accept the name): a set, None where one reads no user."""
    from types import SimpleNamespace

    from werkzeug.datastructures import Authorization

    import mlflow.server.auth as auth

    flask = Authorization.from_header(value.decode("latin-1"))
    fastapi = []
    request = SimpleNamespace(headers={"Authorization": value.decode("latin-1")}, scope={"path": path})
    original = auth._authenticate_cached
    auth._authenticate_cached = lambda user, password: fastapi.append(user) or SimpleNamespace(username=user)
    try:
        from unittest import mock

        with mock.patch.object(auth, "get_routed_asgi_path", lambda r: path):
            auth._authenticate_fastapi_request(request)
    finally:
        auth._authenticate_cached = original
    return {flask.username if flask is not None else None, fastapi[0] if fastapi else None}


@pytest.mark.parametrize("form", sorted(MALFORMED))
def test_the_door_refuses_a_credential_mlflow_would_parse_otherwise(form, monkeypatch):
    """Differential: each malformed form the door lets through names the user MLflow's own parsers read; the
    door refuses (401) every form that is not one canonical Basic credential, before any route sees it."""
    import asyncio

    from flows.record.mlflow_app import NotCanonical, ReadOnlyUsersAtTheDoor, basic_auth_user

    token = base64.b64encode(b"viewer:pw>>?~")  # "+", "/" and padding in the base64
    value = MALFORMED[form](token)
    with pytest.raises(NotCanonical):
        basic_auth_user([(b"authorization", value)])
    reached, sent = [], []

    async def inner(scope, receive, send):
        reached.append(scope["path"])

    async def send(message):
        sent.append(message)

    monkeypatch.setenv("PRIVZO_MLFLOW_READ_ONLY_USERS", "viewer")
    for path in ("/ajax-api/3.0/mlflow/mcp-servers", "/gateway/secrets/create"):
        sent.clear()
        asyncio.run(ReadOnlyUsersAtTheDoor(inner, known=lambda u: True)(
            {"type": "http", "method": "POST", "path": path, "headers": [(b"authorization", value)]}, None, send))
        assert sent[0]["status"] == 401 and not reached
    assert _mlflow_users(b"Basic " + token, "/x") == {"viewer"}  # the canonical form: both read it as the door does
    if form in ("a dot inside the base64", "a tab after Basic", "two spaces", "lowercase scheme"):
        assert "viewer" in _mlflow_users(value, "/x")  # forms MLflow reads as the viewer: a door reading none let
        # the viewer through to write before


def test_the_door_reads_one_user_whichever_header_a_route_reads(monkeypatch):
    """X-MLflow-Authorization (read first on gateway routes) must be the Authorization credential itself; an
    unknown user is refused at the door; a canonical credential of a known user passes as it did."""
    import asyncio

    from flows.record.mlflow_app import ReadOnlyUsersAtTheDoor

    viewer, worker = (b"Basic " + base64.b64encode(f"{u}:pw".encode()) for u in ("viewer", "worker"))
    sent, reached = [], []

    async def inner(scope, receive, send):
        reached.append(scope["path"])

    async def send(message):
        sent.append(message)

    def status(headers, known=lambda u: u in ("viewer", "worker")):
        sent.clear()
        asyncio.run(ReadOnlyUsersAtTheDoor(inner, known=known)(
            {"type": "http", "method": "POST", "path": "/gateway/secrets/create", "headers": headers}, None, send))
        return sent[0]["status"] if sent else None

    monkeypatch.setenv("PRIVZO_MLFLOW_READ_ONLY_USERS", "viewer")
    assert status([(b"authorization", viewer), (b"x-mlflow-authorization", worker)]) == 401
    assert status([(b"x-mlflow-authorization", worker), (b"authorization", viewer)]) == 401
    assert status([(b"authorization", worker), (b"authorization", viewer)]) == 401
    assert status([(b"authorization", viewer), (b"x-mlflow-authorization", viewer)]) == 403
    assert status([(b"authorization", b"Basic " + base64.b64encode(b"mallory:pw"))]) == 401
    assert status([(b"authorization", worker), (b"x-mlflow-authorization", worker)]) is None
    assert status([]) is None and reached  # no credential: basic-auth asks for one


def test_only_a_promoter_moves_a_name_or_removes_a_record_on_every_route_mlflow_serves(monkeypatch):
    """Where the stack names its promoters, moving what a registered name resolves to (an alias, a rename, a stage)
    and removing anything (a version, a model, a run, an experiment, a logged model, a tag) is theirs: the worker,
    to whom MLflow gives MANAGE on what it created, is refused at the door on every such route MLflow serves,
    and keeps every route registering a candidate needs."""
    import asyncio
    import re

    from flows.record.mlflow_app import ReadOnlyUsersAtTheDoor, promoters_only

    sent = []

    async def inner(scope, receive, send):
        pass

    async def send(message):
        sent.append(message)

    def status(user, method, path):
        sent.clear()
        headers = [(b"authorization", b"Basic " + base64.b64encode(f"{user}:pw".encode()))]
        asyncio.run(ReadOnlyUsersAtTheDoor(inner)({"type": "http", "method": method, "path": path,
                                                   "headers": headers}, None, send))
        return sent[0]["status"] if sent else None

    monkeypatch.setenv("PRIVZO_MLFLOW_PROMOTERS", "admin")
    served = [(re.sub(r"<[^>]+>", "x", p), m) for p, m in _endpoints() if "/mlflow/" in p and m not in ("GET", "HEAD")]
    removals = [(p, m) for p, m in served
                if m == "DELETE" or re.search(r"/(delete[^/]*|alias|rename|transition-stage)/?$", p)]
    # the class, as MLflow serves it today: every one of these is a promoter's, on both API prefixes
    named = {p.split("/mlflow/", 1)[1] for p, _ in removals if p.startswith("/api/2.0/")}
    assert {"registered-models/alias", "registered-models/delete", "registered-models/rename",
            "model-versions/delete", "model-versions/delete-tag", "model-versions/transition-stage",
            "runs/delete", "runs/delete-tag", "experiments/delete", "logged-models/x"} <= named
    for path, method in removals:
        assert promoters_only(method, path), (method, path)
        assert status("worker", method, path) == 403, (method, path)
        assert status("admin", method, path) is None, (method, path)
    for method, path in (("POST", "/api/2.0/mlflow/registered-models/alias/"),
                         ("DELETE", "/ajax-api/2.0/mlflow/registered-models/alias")):
        assert status("worker", method, path) == 403
    registering = [("POST", "/api/2.0/mlflow/runs/create"), ("POST", "/api/2.0/mlflow/runs/log-batch"),
                   ("POST", "/api/2.0/mlflow/runs/update"), ("POST", "/api/2.0/mlflow/runs/set-tag"),
                   ("POST", "/api/2.0/mlflow/experiments/create"), ("POST", "/api/2.0/mlflow/registered-models/create"),
                   ("POST", "/api/2.0/mlflow/model-versions/create"), ("POST", "/api/2.0/mlflow/model-versions/set-tag"),
                   ("POST", "/api/2.0/mlflow/logged-models"), ("POST", "/api/2.0/mlflow/runs/restore"),
                   ("GET", "/api/2.0/mlflow/registered-models/alias")]
    for method, path in registering:
        assert not promoters_only(method, path) and status("worker", method, path) is None, (method, path)
    monkeypatch.delenv("PRIVZO_MLFLOW_PROMOTERS")
    assert status("worker", "POST", "/api/2.0/mlflow/registered-models/alias") is None  # no stack: MLflow's rules
    assert status("worker", "DELETE", "/api/2.0/mlflow/model-versions/delete") is None


def test_a_logged_artifact_is_never_written_again_or_deleted(tmp_path):
    """MLflow's artifact proxy lets whoever may write a run overwrite its files in place (a promoted version's
    weights among them): at the door, for every user, an existing artifact takes no other bytes (the same bytes,
    a retry, are answered as done), no multipart upload opens or completes over one, and nothing is deleted. A
    new artifact, and every read, reach MLflow."""
    import asyncio

    from flows.record.mlflow_app import ReadOnlyUsersAtTheDoor, ServedArtifacts, artifact_written

    root = tmp_path / "artifacts"
    (root / "1" / "models" / "m-1" / "artifacts").mkdir(parents=True)
    weights = root / "1" / "models" / "m-1" / "artifacts" / "model.pt2"
    weights.write_bytes(b"the weights the owner verified")
    reached, sent = [], []

    async def inner(scope, receive, send):
        reached.append((scope["method"], scope["path"]))

    async def send(message):
        sent.append(message)

    def status(method, path, body=b"", user="admin"):
        sent.clear()
        chunks = [body[:7], body[7:]]

        async def receive():
            return {"type": "http.request", "body": chunks.pop(0), "more_body": bool(chunks)}

        headers = [(b"authorization", b"Basic " + base64.b64encode(f"{user}:pw".encode()))]
        door = ReadOnlyUsersAtTheDoor(inner, artifacts=ServedArtifacts(str(root)))
        asyncio.run(door({"type": "http", "method": method, "path": path, "headers": headers}, receive, send))
        return sent[0]["status"] if sent else None

    existing = "1/models/m-1/artifacts/model.pt2"
    for prefix in ("/api/2.0/mlflow-artifacts", "/ajax-api/2.0/mlflow-artifacts"):
        for user in ("admin", "worker"):
            assert status("PUT", f"{prefix}/artifacts/{existing}", b"other weights", user) == 403
            assert status("DELETE", f"{prefix}/artifacts/{existing}", user=user) == 403
            assert status("DELETE", f"{prefix}/artifacts/1/models/m-1", user=user) == 403
            for route in ("mpu/create", "mpu/complete"):
                assert status("POST", f"{prefix}/{route}/{existing}", user=user) == 403
        assert status("PUT", f"{prefix}/artifacts/{existing}", b"the weights the owner verified") == 200
        assert status("PUT", f"{prefix}/artifacts/1/models/m-2/artifacts/model.pt2", b"new") is None
        assert status("POST", f"{prefix}/mpu/abort/{existing}") is None
        assert status("GET", f"{prefix}/artifacts/{existing}") is None
    assert weights.read_bytes() == b"the weights the owner verified"
    assert all(path.endswith(("m-2/artifacts/model.pt2", "/mpu/abort/" + existing, "artifacts/" + existing))
               for _, path in reached)
    assert artifact_written("GET", f"/api/2.0/mlflow-artifacts/artifacts/{existing}") is None
    assert artifact_written("PUT", "/api/2.0/mlflow/runs/log-batch") is None
