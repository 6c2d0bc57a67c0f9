"""The Prefect API a run reports to, and whether anything answers there.

With ``PREFECT_API_URL`` set (in the environment or the Prefect profile) Prefect records runs
on that server; with nothing listening there it fails only after its client has retried,
with a long ``httpx.ConnectError`` traceback that never names the URL. ``offmeta run`` and
``offmeta serve`` ask the server's ``/health`` first, with a short timeout, and refuse in
one line that names the URL and what to start.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request

API_URL_ENV = "PREFECT_API_URL"
HEALTH_TIMEOUT_S = 3.0
"""Seconds to wait for ``/health``; a server on the same network answers in milliseconds."""


class PrefectApiError(RuntimeError):
    """No Prefect server answers at the configured API URL."""


def prefect_api_url() -> str | None:
    """The API URL Prefect would use; None: it starts a temporary server for the run.

    The environment variable wins over the profile, as in Prefect; only without it are
    Prefect's settings loaded (importing them takes seconds).
    """
    if url := os.environ.get(API_URL_ENV):
        return url
    from prefect.settings import get_current_settings

    return get_current_settings().api.url


def check_api_answers(url: str, timeout_s: float = HEALTH_TIMEOUT_S) -> None:
    """Raise ``PrefectApiError`` unless something answers HTTP at ``url``/health.

    Any HTTP answer counts (a Prefect Cloud workspace answers 401 without a key; Prefect
    reports that itself); refused connections, unknown hosts and silence do not.
    """
    health = f"{url.rstrip('/')}/health"
    try:
        with urllib.request.urlopen(health, timeout=timeout_s):
            return
    except urllib.error.HTTPError:
        return
    except urllib.error.URLError as error:
        reason = error.reason
        found = reason.strerror if isinstance(reason, OSError) and reason.strerror else reason
    except TimeoutError:
        found = f"no answer within {timeout_s:g} s"
    except ValueError as error:  # not an http(s) URL at all
        found = str(error)
    raise PrefectApiError(
        f"no Prefect server answers at {API_URL_ENV}={url} ({health}: {found}); start one "
        "there (prefect server start), or unset PREFECT_API_URL to run on a temporary server"
    )
