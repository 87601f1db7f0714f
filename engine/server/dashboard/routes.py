"""HTTP for the dashboard: pages, static assets, the JSON API, and who may do what.

Served on the member's metrics port by :class:`~jetwake.engine.server.metrics.MetricsServer`
next to ``/metrics`` and ``/health``:

=======================================  =========================================================
``GET /``, ``/cluster``, ``/snapshots``  the pages (one HTML shell; the script draws each view)
``GET /jobs/ID``                         a job's page; 404 page for an unknown job
``GET /static/NAME``                     the assets, from the installed package
``GET /api/session``                     what the page needs to know about auth
``GET /api/cluster``                     members, coordinator, quorum, process usage
``GET /api/jobs``                        every job, with rates and sparkline points
``GET /api/jobs/ID``                     one job: DAG with readings, Kafka lag, snapshots...
``GET /api/jobs/ID/state/STAGE/C[/KEY]``  a stateful stage's value of KEY, or its first keys
                                          (C: snapshot or latest; KEY as jetwake state takes it)
``GET /api/snapshots``                   exported snapshots
``POST /api/jobs/ID/ACTION``             suspend, resume, restart, cancel, export-snapshot
``DELETE /api/snapshots/NAME``           deletes an exported snapshot
=======================================  =========================================================

Who may do what: the actions (POST, DELETE) need the member's token in the
``X-Jetwake-Token`` header (or ``Authorization: Bearer TOKEN``); a wrong or missing one is
refused with 403 and nothing happens. The header is also what keeps another web site from
acting through a visitor's browser: a page elsewhere cannot send it without the member's
consent (a cross-origin request with a custom header needs a preflight this server never
grants), and a request whose ``Origin`` is not this server is refused too. A member without a
token still requires the header (with any value) for that reason. Reading needs nothing with
``ui_auth="open"``; with ``"required"`` every page and API call needs the token too, from the
header or from the ``jetwake_token`` cookie the page sets for the browser session (a browser
sends no custom header when it loads a page), and a page without it answers 403 with the
form that asks for it. Every action, done or refused, is logged with the client's address.
"""

from __future__ import annotations

import html
import json
import logging
import mimetypes
import re
import urllib.parse
from http.cookies import CookieError, SimpleCookie
from importlib import resources
from typing import TYPE_CHECKING, Any

from jetwake.engine.server.authentication import token_matches
from jetwake.engine.server.dashboard.api import EXPORT_ACTION, ApiError, DashboardApi
from jetwake.engine.server.dashboard.readings import sampler_of

if TYPE_CHECKING:  # pragma: no cover
    from jetwake.engine.server.member import Member

__all__ = ["Dashboard", "UI_AUTH_MODES", "TOKEN_HEADER", "TOKEN_COOKIE"]

log = logging.getLogger("jetwake.dashboard")

UI_AUTH_MODES = ("open", "required")
TOKEN_HEADER = "X-Jetwake-Token"
TOKEN_COOKIE = "jetwake_token"
_PAGES = {"/", "/index.html", "/jobs", "/cluster", "/snapshots"}
_JOB_PAGE = re.compile(r"^/jobs/([^/]+)/?$")
_ASSET = re.compile(r"^/static/([\w-]+\.(?:html|js|css|svg|png|txt))$")
_MAX_BODY = 64 * 1024
# the pages load nothing but this server's own files
_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; "
                               "script-src 'self'; connect-src 'self'; frame-ancestors 'none'; "
                               "base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _json_object(raw: bytes) -> dict:
    """An action's body: empty, or a JSON object."""
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as e:
        raise ApiError(400, f"the body must be JSON: {e}", "ValueError") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object", "ValueError")
    return body


def _static_file(name: str) -> bytes | None:
    """An asset of the installed package's ``static/`` folder; None when there is none."""
    try:
        return (resources.files(__package__) / "static" / name).read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


class Dashboard:
    """The dashboard of one member: ``handle(request, method)`` answers one HTTP request of a
    :class:`http.server.BaseHTTPRequestHandler` (see the module doc)."""

    def __init__(self, member: "Member", handlers: Any, token: str | None,
                 ui_auth: str = "open") -> None:
        if ui_auth not in UI_AUTH_MODES:
            raise ValueError(f"ui_auth must be one of {', '.join(UI_AUTH_MODES)}, got "
                             f"{ui_auth!r}")
        if ui_auth == "required" and not token:
            raise ValueError("ui_auth='required' needs the member's token (--token): the "
                             "pages ask for it")
        self.api = DashboardApi(member, handlers)
        self.token = token or None
        self.ui_auth = ui_auth
        shell = _static_file("index.html")
        if shell is None:
            raise FileNotFoundError("the dashboard's static/index.html is not installed with "
                                    "the package; reinstall jetwake")
        self._shell = shell
        sampler_of(member)  # rates and sparklines from now on, before the first page loads

    # --- one request -------------------------------------------------------------------------

    def handle(self, req: Any, method: str) -> None:
        """Answers one request (GET, POST or DELETE) on ``req``, the HTTP handler."""
        path = urllib.parse.urlsplit(req.path).path
        peer = f"dashboard {req.client_address[0]}:{req.client_address[1]}"
        try:
            if path.startswith("/api/") or path == "/api":
                self._api(req, method, path, peer)
            elif method != "GET":
                self._send(req, 405, b"only GET here; actions are under /api/\n",
                           "text/plain; charset=utf-8", {"Allow": "GET"})
            else:
                self._page(req, path, peer)
        except ApiError as e:
            self._json(req, e.status, e.body())
        except Exception as e:  # noqa: BLE001 - an answer, never a dropped connection
            log.exception("dashboard: %s %s failed", method, path)
            body = ApiError(500, f"{type(e).__name__}: {e}", type(e).__name__).body()
            if path.startswith("/api"):
                self._json(req, 500, body)
            else:
                self._html(req, 500, self._message_page("Something went wrong",
                                                        body["message"]))

    # --- pages -------------------------------------------------------------------------------

    def _page(self, req: Any, path: str, peer: str) -> None:
        asset = _ASSET.match(path)
        if asset:  # no data in them: served without the token (the login form needs them)
            body = _static_file(asset.group(1))
            if body is None:
                self._send(req, 404, b"no such asset\n", "text/plain; charset=utf-8")
                return
            ctype = mimetypes.guess_type(asset.group(1))[0] or "application/octet-stream"
            if ctype.startswith("text/") or ctype.endswith("javascript"):
                ctype += "; charset=utf-8"
            self._send(req, 200, body, ctype)
            return
        if path == "/favicon.ico":
            self._send(req, 204, b"", "image/x-icon")
            return
        job = _JOB_PAGE.match(path)
        if path not in _PAGES and job is None:
            self._html(req, 404, self._message_page(
                "Page not found", f"There is no page {path!r} here. The dashboard's pages are "
                "Jobs, Cluster and Snapshots."))
            return
        if self.ui_auth == "required" and not self._reader_ok(req):
            # the shell holds no data: it shows the form that asks for the token
            self._html(req, 403, self._shell)
            return
        if job is not None:
            job_id = urllib.parse.unquote(job.group(1))
            if not self.api.job_exists(job_id, peer):
                self._html(req, 404, self._message_page(
                    "No such job", f"There is no job with the name or id {job_id!r} on this "
                    "member or its cluster. It may run on another cluster, or it was removed."))
                return
        self._html(req, 200, self._shell)

    def _message_page(self, title: str, text: str) -> bytes:
        return (f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
                f"<title>{html.escape(title)} · jetwake</title>"
                f"<link rel=\"stylesheet\" href=\"/static/style.css\"></head><body>"
                f"<header class=\"top\"><a class=\"brand\" href=\"/\">jetwake</a></header>"
                f"<main class=\"message\"><h1>{html.escape(title)}</h1>"
                f"<p id=\"message\">{html.escape(text)}</p>"
                f"<p><a href=\"/\">Back to the jobs</a></p></main></body></html>").encode()

    # --- the API -----------------------------------------------------------------------------

    def _api(self, req: Any, method: str, path: str, peer: str) -> None:
        parts = [urllib.parse.unquote(p) for p in path.split("/")[2:] if p]
        if method == "GET":
            if parts == ["session"]:  # answered without the token: the page asks it first
                self._json(req, 200, self._session(req))
                return
            if self.ui_auth == "required" and not self._reader_ok(req):
                self._json(req, 403, ApiError(
                    403, "this dashboard needs the member's token to be read: send it in the "
                         f"{TOKEN_HEADER} header", "Forbidden").body())
                return
            self._json(req, 200, self._read(parts, peer))
            return
        if method not in ("POST", "DELETE"):
            raise ApiError(405, f"{method} is not used by this API", "MethodNotAllowed")
        raw = self._raw_body(req)
        try:
            body, body_error = _json_object(raw), None
        except ApiError as e:  # told after the token check: a refusal comes first
            body, body_error = {}, e
        kind, subject, action = self._action_of(method, parts, body)
        target = f"{kind} '{subject}'"
        refusal = self._action_refusal(req)
        client = f"{req.client_address[0]}:{req.client_address[1]}"
        if refusal is not None:
            log.warning("dashboard: %s of %s refused for %s: %s", action, target, client,
                        refusal)
            raise ApiError(403, f"{action} refused: {refusal}", "Forbidden")
        if body_error is not None:
            raise body_error
        log.info("dashboard: %s of %s requested by %s", action, target, client)
        try:
            if kind == "snapshot":
                result = self.api.delete_snapshot(subject, peer)
            else:
                result = self.api.job_action(subject, action, body, peer)
        except ApiError as e:
            log.warning("dashboard: %s of %s requested by %s failed: %s", action, target,
                        client, e.message)
            raise
        self._json(req, 200, result)

    def _read(self, parts: list[str], peer: str) -> Any:
        if parts == ["cluster"]:
            return self.api.cluster(peer)
        if parts == ["jobs"]:
            return self.api.jobs(peer)
        if len(parts) == 2 and parts[0] == "jobs":
            return self.api.job(parts[1], peer)
        if len(parts) in (5, 6) and parts[0] == "jobs" and parts[2] == "state":
            # /api/jobs/ID/state/STAGE/CONSISTENCY[/KEY]: a stage's value of KEY, or its keys
            return self.api.job_state(parts[1], parts[3], parts[4],
                                      parts[5] if len(parts) == 6 else None, peer)
        if parts == ["snapshots"]:
            return self.api.snapshots(peer)
        raise ApiError(404, f"no API call GET /api/{'/'.join(parts)}; the calls are "
                            "/api/session, /api/cluster, /api/jobs, /api/jobs/ID and "
                            "/api/snapshots", "NotFound")

    @staticmethod
    def _action_of(method: str, parts: list[str], body: dict) -> tuple[str, str, str]:
        """(``job`` or ``snapshot``, its id or name, the action) of an action request, or
        ApiError 404. ``POST /api/jobs/ID/ACTION`` is the form the page uses; ``POST
        /api/jobs/ID/actions/ACTION``, ``POST /api/jobs/ID`` with ``{"action": ACTION}`` and
        ``POST /api/snapshots/NAME/delete`` are accepted too."""
        if method == "DELETE" and len(parts) == 2 and parts[0] == "snapshots":
            return "snapshot", parts[1], "delete"
        if method == "POST":
            if len(parts) == 3 and parts[0] == "snapshots" and parts[2] == "delete":
                return "snapshot", parts[1], "delete"
            if parts[:1] == ["jobs"]:
                action = None
                if len(parts) == 3:
                    action = parts[2]
                elif len(parts) == 4 and parts[2] == "actions":
                    action = parts[3]
                elif len(parts) == 2 and isinstance(body.get("action"), str):
                    action = body["action"]
                if action is not None:
                    action = action.replace("_", "-")
                    return "job", parts[1], EXPORT_ACTION if action == "export" else action
        raise ApiError(404, f"no API call {method} /api/{'/'.join(parts)}; the actions are "
                            "POST /api/jobs/ID/ACTION and DELETE /api/snapshots/NAME",
                       "NotFound")

    @staticmethod
    def _raw_body(req: Any) -> bytes:
        length = req.headers.get("Content-Length")
        try:
            n = int(length) if length else 0
        except ValueError:
            raise ApiError(400, "Content-Length must be a number", "ValueError") from None
        if n < 0 or n > _MAX_BODY:
            raise ApiError(413, f"the body must be at most {_MAX_BODY} bytes", "ValueError")
        return req.rfile.read(n) if n else b""

    # --- who may -----------------------------------------------------------------------------

    @staticmethod
    def _header_token(req: Any) -> str | None:
        token = req.headers.get(TOKEN_HEADER)
        if token is None:
            auth = req.headers.get("Authorization") or ""
            if auth.startswith("Bearer "):
                token = auth[len("Bearer "):]
        return token

    @staticmethod
    def _cookie_token(req: Any) -> str | None:
        raw = req.headers.get("Cookie")
        if not raw:
            return None
        try:
            morsel = SimpleCookie(raw).get(TOKEN_COOKIE)
        except CookieError:
            return None
        return urllib.parse.unquote(morsel.value) if morsel is not None else None

    def _token_ok(self, given: str | None) -> bool:
        if given is None:
            return False
        return self.token is None or token_matches(self.token, given)

    def _reader_ok(self, req: Any) -> bool:
        """Whether the request may read (with ``ui_auth="required"``): the token from the
        header or from the page's cookie."""
        return self._token_ok(self._header_token(req)) or \
            self._token_ok(self._cookie_token(req))

    def _action_refusal(self, req: Any) -> str | None:
        """Why an action request is refused; None when it may run. Only the header counts:
        a cookie is sent by the browser on its own, whoever made the page."""
        origin = req.headers.get("Origin")
        host = req.headers.get("Host")
        if origin and origin != "null" and host and \
                urllib.parse.urlsplit(origin).netloc != host:
            return f"the request comes from another site ({origin})"
        given = self._header_token(req)
        if given is None:
            return (f"no token: send the member's token in the {TOKEN_HEADER} header")
        if not self._token_ok(given):
            return "wrong token"
        return None

    def _session(self, req: Any) -> dict:
        return {"ui_auth": self.ui_auth, "token_required": self.token is not None,
                "authorized": self._token_ok(self._header_token(req)),
                "readable": self.ui_auth == "open" or self._reader_ok(req),
                "token_header": TOKEN_HEADER}

    # --- answers -----------------------------------------------------------------------------

    def _json(self, req: Any, code: int, doc: Any) -> None:
        self._send(req, code, (json.dumps(doc, default=str) + "\n").encode(),
                   "application/json")

    def _html(self, req: Any, code: int, body: bytes) -> None:
        self._send(req, code, body, "text/html; charset=utf-8")

    @staticmethod
    def _send(req: Any, code: int, body: bytes, ctype: str,
              extra: dict[str, str] | None = None) -> None:
        req.send_response(code)
        req.send_header("Content-Type", ctype)
        req.send_header("Content-Length", str(len(body)))
        for k, v in {**_SECURITY_HEADERS, **(extra or {})}.items():
            req.send_header(k, v)
        req.end_headers()
        if req.command != "HEAD":
            req.wfile.write(body)
