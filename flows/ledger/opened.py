"""The process's one ledger per URL (``PrivacyLedger.open``): a cache that knows when sharing would not be the
same ledger."""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Callable, Optional


def _in_memory(url: str) -> bool:
    """An in-memory SQLite URL: each engine is a database of its own, so such a ledger is never shared."""
    return url.startswith("sqlite") and (url.split("://", 1)[-1] in ("", "/", "/:memory:") or "mode=memory" in url)


def _file_identity(url: str) -> Optional[tuple]:
    """A SQLite ledger's file as it is now (device, inode), None where there is no such file; () for a server."""
    if not url.startswith("sqlite"):
        return ()
    from sqlalchemy.engine import make_url

    path = make_url(url).database
    try:
        found = os.stat(path)
    except (OSError, TypeError, ValueError):
        return None
    return found.st_dev, found.st_ino


# the ledgers PrivacyLedger.open has opened in this process: (pid, url) -> (ledger, its file's identity)
_OPENED: "OrderedDict[tuple, tuple]" = OrderedDict()
_OPENED_LOCK = threading.Lock()
_OPENED_MOST = 16  # the least recently opened beyond these are let go (a caller still holding one keeps it)


def shared(url: str, make: Callable[[str, bool], object]):
    """The ledger at ``url`` this process already opened, else ``make(url, pooled)``'s, kept for the next caller
    (``PrivacyLedger.open`` says when it is opened anew)."""
    if _in_memory(url):
        return make(url, True)
    key = (os.getpid(), url)
    with _OPENED_LOCK:
        found = _OPENED.get(key)
        if found is not None and found[0].terms_kept and found[1] is not None and found[1] == _file_identity(url):
            _OPENED.move_to_end(key)
            return found[0]
        ledger = make(url, False)
        _OPENED[key] = (ledger, _file_identity(url))
        _OPENED.move_to_end(key)
        while len(_OPENED) > _OPENED_MOST:
            _OPENED.popitem(last=False)
        return ledger
