"""Container healthchecks: `python -m kernelsearch.service.deploy.healthcheck api|worker` exits 0 when healthy.

The image has no curl, and a check must not start the whole CLI (torch import) every few
seconds (`service/__init__.py` and `service/deploy/__init__.py` import nothing, so `-m` stays
light): the API check is one HTTP request with the standard library; the worker check looks for
the worker process and asks the database for a round trip.
"""
from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from pathlib import Path


def check_api() -> str | None:
    """None when GET /healthz answers 200, else the reason."""
    port = int(os.environ.get("KS_API_PORT", "8000"))
    url = f"http://127.0.0.1:{port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=4) as resp:
            return None if resp.status == 200 else f"{url} answered {resp.status}"
    except urllib.error.HTTPError as exc:
        return f"{url} answered {exc.code}: {exc.read(300).decode(errors='replace')}"
    except OSError as exc:
        return f"{url} unreachable: {exc}"


def _worker_running() -> bool:
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"kernelsearch") for a in argv) and b"worker" in argv:
            return True
    return False


def check_worker() -> str | None:
    """None when a `kernelsearch worker` process runs and the database answers."""
    if not _worker_running():
        return "no `kernelsearch worker` process"
    url = os.environ.get("KS_DATABASE_URL")
    if not url:
        return "KS_DATABASE_URL is not set"
    from sqlalchemy import create_engine, text

    engine = create_engine(url, pool_pre_ping=False)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # any driver error means unhealthy; report its class only
        return f"database unreachable ({type(exc).__name__})"
    finally:
        engine.dispose()
    return None


CHECKS = {"api": check_api, "worker": check_worker}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in CHECKS:
        print(f"usage: python -m kernelsearch.service.deploy.healthcheck {'|'.join(CHECKS)}", file=sys.stderr)
        return 2
    problem = CHECKS[argv[0]]()
    if problem:
        print(problem, file=sys.stderr)
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
