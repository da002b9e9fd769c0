"""A small Python client of the REST API: lookups and jobs, with the server's messages as errors.

    from kernelsearch.rest_client import Client
    with Client("http://127.0.0.1:8000", token="...") as c:
        best = c.best("vision_rope3d_spatial_merge_bwd", "NVIDIA H200", seq_len=1024)
        job = c.submit_job("vision_rope3d_spatial_merge_bwd", [{"seq_len": 2}], n_trials=20)
        c.wait(job["id"], timeout=600)
"""
from __future__ import annotations

import time
from typing import Any, Literal, Mapping, Sequence

import httpx

from kernelsearch.db.statuses import FINISHED_STATUSES

TERMINAL = frozenset(FINISHED_STATUSES)


class ClientError(Exception):
    """A request the service refused or could not answer; `status` is the HTTP status (0: none)."""

    status: int = 0

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status


class ServiceUnreachable(ClientError):
    """No HTTP answer at all: connection refused, DNS failure, timeout."""


class BadRequest(ClientError):
    status = 400


class Unauthorized(ClientError):
    status = 401


class NotFound(ClientError):
    status = 404


class AlreadyExists(ClientError):
    """409: what the request would write is there already (another upload's set, a queued job)."""

    status = 409


class PayloadTooLarge(ClientError):
    status = 413


class InvalidRequest(ClientError):
    status = 422


class TooManyRequests(ClientError):
    status = 429


class ServiceUnavailable(ClientError):
    status = 503


class JobTimeout(ClientError, TimeoutError):
    """`wait` gave up before the job reached a final status."""


_BY_STATUS: dict[int, type[ClientError]] = {
    400: BadRequest, 401: Unauthorized, 403: Unauthorized, 404: NotFound, 409: AlreadyExists,
    413: PayloadTooLarge, 422: InvalidRequest, 429: TooManyRequests, 503: ServiceUnavailable,
}


def _message(resp: httpx.Response) -> str:
    """The server's own message: FastAPI's `detail` (a string or a list of validation errors)."""
    try:
        body = resp.json()
    except ValueError:
        return resp.text.strip() or resp.reason_phrase
    detail = body.get("detail", body) if isinstance(body, dict) else body
    if isinstance(detail, list):
        parts = []
        for err in detail:
            if isinstance(err, dict):
                loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
                parts.append(f"{loc}: {err.get('msg', err)}" if loc else str(err.get("msg", err)))
            else:
                parts.append(str(err))
        return "; ".join(parts)
    return str(detail)


class Client:
    """Lookups and jobs against one kernelsearch service."""

    def __init__(self, base_url: str, token: str | None = None, timeout: float = 10.0,
                 *, transport: httpx.BaseTransport | None = None) -> None:
        if not base_url:
            raise ValueError("base_url: give the service's address, e.g. http://127.0.0.1:8000")
        # The routes carry their own /v1: an address ending in it would make every request miss.
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout,
                                  transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kw: Any) -> Any:
        try:
            resp = self._http.request(method, path, **kw)
        except httpx.TransportError as exc:
            raise ServiceUnreachable(f"{method} {path}: service unreachable: {exc}") from exc
        if resp.is_success:
            return resp.json()
        cls = _BY_STATUS.get(resp.status_code, ClientError)
        raise cls(f"{method} {path}: HTTP {resp.status_code}: {_message(resp)}", resp.status_code)

    # -- lookups ------------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return self._request("GET", "/healthz")

    def kernels(self) -> list[dict[str, Any]]:
        return self._request("GET", "/v1/kernels")

    def best(self, kernel: str, device: str, **axes: int) -> dict[str, Any]:
        """The best record for these axes on that device (exact, or the nearest tuned case)."""
        params = {"kernel": kernel, "device": device, **{k: str(v) for k, v in axes.items()}}
        return self._request("GET", "/v1/best", params=params)

    def records(self, kernel: str | None = None, device: str | None = None,
                history: bool = False) -> list[dict[str, Any]]:
        params: dict[str, Any] = {k: v for k, v in (("kernel", kernel), ("device", device))
                                  if v is not None}
        if history:
            params["history"] = "true"
        return self._request("GET", "/v1/records", params=params)

    def export_records(self, kernel: str | None = None, device: str | None = None,
                       history: bool = False) -> dict[str, Any]:
        """The records document `kernelsearch records export` writes (schema kernelsearch.records)."""
        params: dict[str, Any] = {k: v for k, v in (("kernel", kernel), ("device", device))
                                  if v is not None}
        if history:
            params["history"] = "true"
        return self._request("GET", "/v1/export", params=params)

    def definitions(self) -> dict[str, Any]:
        """The undeclared kernels' definitions the service keeps, by name."""
        return self._request("GET", "/v1/definitions")

    def search(self, kernel: str | None = None) -> list[dict[str, Any]]:
        """Queue a search job per captured key (writer token); the service's budget decides."""
        return self._request("POST", "/v1/search", json={"kernel": kernel})["jobs"]

    def upload_record(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """Store a record tuned outside the workers (the fields of an exported record)."""
        return self._request("POST", "/v1/records", json=dict(record))

    def register_kernel(self, definition: Mapping[str, Any]) -> dict[str, Any]:
        """Register an undeclared kernel's definition (kernels.undeclared.Definition as JSON)."""
        return self._request("POST", "/v1/kernels", json=dict(definition))

    # -- compiled kernels (kernelsearch.artifacts) ---------------------------------------------
    def upload_artifacts(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Store a compile group for a record (`POST /v1/artifacts`, writer token)."""
        return self._request("POST", "/v1/artifacts", json=dict(body))

    def artifacts(self, env_fingerprint: str, *, record_id: int | None = None,
                  cache_key: str | None = None) -> list[dict[str, Any]]:
        """The compile groups of one record, or under one Triton cache key, for this fingerprint."""
        if record_id is not None:
            return self._request("GET", "/v1/artifacts", params={
                "record_id": record_id, "env_fingerprint": env_fingerprint})
        return self._request("GET", "/v1/artifacts/by-cache-key", params={
            "cache_key": cache_key, "env_fingerprint": env_fingerprint})

    def device_artifacts(self, device: str, env_fingerprint: str,
                         kernels: Sequence[str] | None = None, *, after: int = 0,
                         max_bytes: int | None = None) -> list[dict[str, Any]]:
        """A page of the compile groups of the current records on this device, oldest first
        past set id `after`, within `max_bytes` and the service's bound (a prefetch pages on)."""
        params: dict[str, Any] = {"device": device, "env_fingerprint": env_fingerprint,
                                  "after": after}
        if max_bytes is not None:
            params["max_bytes"] = max_bytes
        if kernels:
            params["kernel"] = list(kernels)
        return self._request("GET", "/v1/artifacts/device", params=params)

    def upload_helion_artifacts(self, key: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Store a compile group for the Helion entry under `key` (writer token)."""
        return self._request("POST", f"/v1/helion/entries/{key}/artifacts", json=dict(body))

    def helion_artifacts(self, key: str, env_fingerprint: str) -> list[dict[str, Any]]:
        """The compile groups of the Helion entry under `key` for this fingerprint."""
        return self._request("GET", f"/v1/helion/entries/{key}/artifacts",
                             params={"env_fingerprint": env_fingerprint})

    # -- Helion's autotune cache (kernelsearch.helion) ------------------------------------------
    def helion_get(self, key: str) -> dict[str, Any] | None:
        """The Helion entry stored under Helion's cache key (its `data` is the exact text); None
        when there is none."""
        try:
            return self._request("GET", f"/v1/helion/entries/{key}")
        except NotFound:
            return None

    def helion_put(self, key: str, data: str, *, kernel: str | None = None,
                   arg_names: Sequence[str] | None = None, checked: bool | None = None) -> dict[str, Any]:
        """Store Helion's entry text under its cache key (writer token)."""
        body: dict[str, Any] = {"data": data, "kernel": kernel, "checked": checked,
                                "arg_names": list(arg_names) if arg_names is not None else None}
        return self._request("PUT", f"/v1/helion/entries/{key}", json=body)

    def helion_list(self, limit: int = 100, *, kernel: str | None = None,
                    hardware: str | None = None) -> list[dict[str, Any]]:
        """The newest Helion entries first."""
        params: dict[str, Any] = {"limit": limit}
        params.update({k: v for k, v in (("kernel", kernel), ("hardware", hardware)) if v is not None})
        return self._request("GET", "/v1/helion/entries", params=params)

    def helion_queue(self, key: str, capture: Mapping[str, Any]) -> dict[str, Any]:
        """Queue a worker's tuning of a Helion cache miss (writer token); the key's job already
        queued or running answers instead (`existing`)."""
        return self._request("POST", "/v1/helion/jobs", json={"key": key, "capture": dict(capture)})

    # -- jobs ---------------------------------------------------------------------------------
    def keep_capture(self, kernel: str, capture: Mapping[str, Any]) -> dict[str, Any]:
        """POST /v1/captures: keep a call this process tuned itself, for a search of its key."""
        return self._request("POST", "/v1/captures", json={"kernel": kernel, "capture": dict(capture)})

    def submit_job(self, kernel: str, cases: Sequence[Mapping[str, int]] | Literal["all"],
                   n_trials: int, sampler: str | None = None,
                   timeout_s: float | None = None,
                   capture: Mapping[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"kernel": kernel,
                                "cases": cases if cases == "all" else [dict(c) for c in cases],
                                "n_trials": n_trials}
        if sampler is not None:
            body["sampler"] = sampler
        if timeout_s is not None:
            body["timeout_s"] = timeout_s
        if capture is not None:
            body["capture"] = dict(capture)
        return self._request("POST", "/v1/jobs", json=body)

    def job(self, job_id: int | str) -> dict[str, Any]:
        return self._request("GET", f"/v1/jobs/{job_id}")

    def jobs(self, status: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit}
        if status is not None:
            params["status"] = status
        return self._request("GET", "/v1/jobs", params=params)

    def cancel(self, job_id: int | str) -> dict[str, Any]:
        return self._request("POST", f"/v1/jobs/{job_id}/cancel")

    def wait(self, job_id: int | str, timeout: float, poll_s: float = 1.0) -> dict[str, Any]:
        """Poll until the job is succeeded, failed or cancelled; JobTimeout after `timeout` s."""
        if timeout <= 0:
            raise ValueError("timeout: must be positive seconds")
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job["status"] in TERMINAL:
                return job
            left = deadline - time.monotonic()
            if left <= 0:
                raise JobTimeout(f"job {job_id} still {job['status']} after {timeout:g} s "
                                 f"({job.get('trials_done')} trials done)")
            time.sleep(min(poll_s, left))
