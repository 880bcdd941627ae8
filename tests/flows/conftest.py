import pytest


@pytest.fixture(scope="session")
def prefect_server():
    """A real temporary Prefect server on 127.0.0.1 for the whole session, stopped at the end; yields its
    API URL (a subprocess given it as PREFECT_API_URL uses this server instead of starting its own)."""
    import prefect.settings
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield prefect.settings.PREFECT_API_URL.value()
