"""Loopback servers for the APIs `launch doctor` calls that moto and the Vertex fake do not serve:
IAM's SimulatePrincipalPolicy, Service Quotas' ListServiceQuotas and Cloud Quotas' quotaInfos.
Each speaks the wire protocol the real client library sends (query/XML, JSON 1.1, REST/JSON), so
the doctor runs its real boto3 / requests calls against them.

:class:`IamWithSimulation` answers SimulatePrincipalPolicy by evaluating given policy statements
(the Terraform's, in the tests) with tests/infra/iam.py, and passes every other IAM action through
to moto, so GetRole still reads moto's roles.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse
from xml.sax.saxutils import escape

from tests.infra.iam import Request, decide

Statements = Callable[[str], list[dict[str, Any]]]


class _Server:
    """A threaded HTTP server on 127.0.0.1 whose requests go to ``handle``."""

    def __init__(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                self._serve("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._serve("POST")

            def _serve(self, verb: str) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, content_type, data = owner.handle(verb, self.path, dict(self.headers),
                                                          body)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.calls: list[tuple[str, str]] = []
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        threading.Thread(target=self._http.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"

    def handle(self, verb: str, path: str, headers: dict[str, str], body: bytes
               ) -> tuple[int, str, bytes]:
        raise NotImplementedError

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()


class IamWithSimulation(_Server):
    """IAM: SimulatePrincipalPolicy evaluated here, everything else forwarded to moto."""

    def __init__(self, moto_endpoint: str, statements: Statements):
        self.moto = moto_endpoint
        self.statements = statements
        super().__init__()

    def handle(self, verb: str, path: str, headers: dict[str, str], body: bytes
               ) -> tuple[int, str, bytes]:
        params = {k: v[-1] for k, v in parse_qs(body.decode()).items()}
        self.calls.append((params.get("Action", ""), params.get("PolicySourceArn", "")))
        if params.get("Action") != "SimulatePrincipalPolicy":
            forwarded = urllib.request.Request(self.moto + path, data=body, method=verb, headers={
                k: v for k, v in headers.items() if k.lower() not in ("host", "content-length")})
            with urllib.request.urlopen(forwarded, timeout=10) as answer:
                return answer.status, answer.headers.get("Content-Type", "text/xml"), answer.read()
        principal = params["PolicySourceArn"]
        context = {"aws:username": principal.rsplit("/", 1)[-1]} if ":user/" in principal else {}
        for n in range(1, 20):
            key = params.get(f"ContextEntries.member.{n}.ContextKeyName")
            if key is None:
                break
            context[key] = params[f"ContextEntries.member.{n}.ContextKeyValues.member.1"]
        actions = _members(params, "ActionNames")
        resources = _members(params, "ResourceArns") or ["*"]
        statements = self.statements(principal)
        results = []
        for action in actions:
            for resource in resources:
                decision = decide(statements, Request(action, resource, context))
                results.append(
                    "<member>"
                    f"<EvalActionName>{escape(action)}</EvalActionName>"
                    f"<EvalResourceName>{escape(resource)}</EvalResourceName>"
                    f"<EvalDecision>{decision}</EvalDecision>"
                    "<MatchedStatements/><MissingContextValues/>"
                    "</member>")
        xml = ("<SimulatePrincipalPolicyResponse xmlns=\"https://iam.amazonaws.com/doc/2010-05-08/\">"
               "<SimulatePrincipalPolicyResult><IsTruncated>false</IsTruncated>"
               f"<EvaluationResults>{''.join(results)}</EvaluationResults>"
               "</SimulatePrincipalPolicyResult>"
               "<ResponseMetadata><RequestId>loopback</RequestId></ResponseMetadata>"
               "</SimulatePrincipalPolicyResponse>")
        return 200, "text/xml", xml.encode()


def _members(params: dict[str, str], name: str) -> list[str]:
    found = []
    for n in range(1, 100):
        value = params.get(f"{name}.member.{n}")
        if value is None:
            break
        found.append(value)
    return found


class ServiceQuotas(_Server):
    """Service Quotas (JSON 1.1): ListServiceQuotas of SageMaker, two quotas per page."""

    def __init__(self, quotas: dict[str, float], deny: bool = False):
        self.quotas = quotas
        self.deny = deny
        super().__init__()

    def handle(self, verb: str, path: str, headers: dict[str, str], body: bytes
               ) -> tuple[int, str, bytes]:
        target = headers.get("X-Amz-Target", "")
        self.calls.append((target, body.decode()))
        request = json.loads(body or b"{}")
        if self.deny:
            return 400, "application/x-amz-json-1.1", json.dumps({
                "__type": "AccessDeniedException",
                "message": "not authorized to perform servicequotas:ListServiceQuotas"}).encode()
        if not target.endswith(".ListServiceQuotas") or request.get("ServiceCode") != "sagemaker":
            return 400, "application/x-amz-json-1.1", json.dumps({
                "__type": "NoSuchResourceException", "message": target}).encode()
        names = sorted(self.quotas)
        start = int(request.get("NextToken") or 0)
        page = names[start:start + 2]
        answer: dict[str, Any] = {"Quotas": [
            {"ServiceCode": "sagemaker", "QuotaName": n, "QuotaCode": f"L-{i:08X}",
             "Value": self.quotas[n], "Adjustable": True}
            for i, n in enumerate(page, start)]}
        if start + 2 < len(names):
            answer["NextToken"] = str(start + 2)
        return 200, "application/x-amz-json-1.1", json.dumps(answer).encode()


class CloudQuotas(_Server):
    """Cloud Quotas (REST): quotaInfos of aiplatform.googleapis.com, one per page."""

    def __init__(self, project: str, gpus: dict[str, dict[str, float]], status: int = 200):
        self.project = project
        self.gpus = gpus  # metric -> region -> value
        self.status = status
        super().__init__()

    def handle(self, verb: str, path: str, headers: dict[str, str], body: bytes
               ) -> tuple[int, str, bytes]:
        url = urlparse(path)
        self.calls.append((verb, url.path))
        expected = (f"/v1/projects/{self.project}/locations/global/services/"
                    "aiplatform.googleapis.com/quotaInfos")
        if self.status != 200 or url.path != expected:
            status = self.status if self.status != 200 else 404
            return status, "application/json", json.dumps({"error": {
                "code": status, "message": "Permission 'cloudquotas.quotas.get' denied"
                if status == 403 else f"no route {url.path}"}}).encode()
        infos = [{
            "name": f"projects/{self.project}/locations/global/services/"
                    f"aiplatform.googleapis.com/quotaInfos/{metric}",
            "quotaId": metric, "metric": f"aiplatform.googleapis.com/{metric}",
            "service": "aiplatform.googleapis.com", "isPrecise": True,
            "dimensionsInfos": [{"dimensions": {"region": region},
                                 "details": {"value": str(int(value))},
                                 "applicableLocations": [region]}
                                for region, value in regions.items()],
        } for metric, regions in sorted(self.gpus.items())]
        start = int((parse_qs(url.query).get("pageToken") or ["0"])[0])
        answer: dict[str, Any] = {"quotaInfos": infos[start:start + 1]}
        if start + 1 < len(infos):
            answer["nextPageToken"] = str(start + 1)
        return 200, "application/json", json.dumps(answer).encode()


class GoogleIam(_Server):
    """IAM (REST): serviceAccounts.testIamPermissions, answering with the permissions ``granted``
    holds for the account (404 for an account it does not know)."""

    def __init__(self, granted: dict[str, set[str]]):
        self.granted = granted
        super().__init__()

    def handle(self, verb: str, path: str, headers: dict[str, str], body: bytes
               ) -> tuple[int, str, bytes]:
        self.calls.append((verb, path))
        prefix, suffix = "/v1/projects/-/serviceAccounts/", ":testIamPermissions"
        account = path.removeprefix(prefix).removesuffix(suffix)
        if verb != "POST" or not path.startswith(prefix) or not path.endswith(suffix) or \
                account not in self.granted:
            return 404, "application/json", json.dumps({"error": {
                "code": 404, "message": f"Service account {account} does not exist."}}).encode()
        asked = json.loads(body or b"{}").get("permissions", [])
        allowed = [p for p in asked if p in self.granted[account]]
        return 200, "application/json", json.dumps(
            {"permissions": allowed} if allowed else {}).encode()
