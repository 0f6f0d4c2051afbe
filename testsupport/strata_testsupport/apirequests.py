"""Every API request the in-process operator makes, recorded during the integration tests and checked against the
chart's RBAC.

A hand-written list of the permissions the handlers need drifts from the code: a new call is added and the list
is not, and the chart passes its tests while the installed operator gets 403s. Here the list is what the operator
actually did. While the `operator` fixture runs, both of its clients are wrapped: the `kubernetes` client
(`RESTClientObject.request`, under every typed and dynamic call the handlers and the webhook make) and kopf's own
(`kopf._cogs.clients.api.request`, under its watches, patches and events). Each request is turned into the
attributes the API server's authorizer sees (verb, group, resource, subresource, namespace, name; a URL outside
the resource tree as a non-resource path). At the end of the session `chart_denials` renders the chart in both
install modes, applies its RBAC for a throwaway service account, and asks the API server's authorizer (a
SubjectAccessReview) about every recorded request: one the chart does not grant fails the session.

Only the operator's requests count: the tests talk to the same API server through the same client classes. A
context variable (`OPERATOR`) marks the operator's work: set in the thread that runs kopf (`OperatorRunner`) and in
the webhook's event loop, and carried from there into every task (asyncio copies the context into each one) and
into the worker threads (kopf runs sync handlers in a copied context, `asyncio.to_thread` does too, and the
controllers' reconciles run under `contextvars.copy_context().run`). A request from a thread that started
elsewhere is not the operator's and is ignored.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
import urllib.parse
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

OPERATOR: contextvars.ContextVar[bool] = contextvars.ContextVar("strata_operator_api_requests", default=False)
"""True in the operator's own threads and tasks: their API requests are recorded."""
CALLED: contextvars.ContextVar[list[ApiRequest] | None] = contextvars.ContextVar(
    "strata_called_api_requests", default=None
)
"""Where a test's own call of the operator's code (`requests_of`) collects every API request it makes."""

APPLY_PATCH = "application/apply-patch+yaml"
NAMESPACE_SUBRESOURCES = ("status", "finalize")
"""What may follow /namespaces/<name>/ and is a subresource of that Namespace, not a resource inside it."""
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
AUTHORIZER_CATCH_UP_SECONDS = 30.0
"""The authorizer reads RBAC objects from its informers: a grant applied a moment ago may not be seen yet. Before
any recorded request is asked, each binding applied must show (`binding_probes`), for at most this long."""


@dataclass(frozen=True)
class ApiRequest:
    """One request as the authorizer sees it. `namespace` None: a cluster-scoped object, or a namespaced kind
    across all namespaces. `path` is set only for a non-resource URL (discovery, /version), whose `resource` is ''."""

    verb: str
    group: str = ""
    version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str | None = None
    name: str = ""
    path: str = ""

    @property
    def key(self) -> tuple[str, str, str, str, bool, str]:
        """What makes two requests the same permission: the object's name and namespace do not (the chart grants
        by kind), but whether it was namespaced or across all namespaces does."""
        return (self.verb, self.group, self.resource, self.subresource, self.namespace is None, self.path)

    def describe(self) -> str:
        if not self.resource:
            return f"{self.verb} {self.path} (non-resource URL)"
        what = "/".join(p for p in (self.resource, self.subresource) if p)
        group = self.group or "core"
        where = f"in namespace {self.namespace}" if self.namespace is not None else "cluster-wide"
        named = f" {self.name!r}" if self.name else ""
        return f"{self.verb} {group} {what}{named} {where}"


def parse(
    method: str,
    url: str,
    query: Iterable[tuple[str, Any]] | Mapping[str, Any] | None = None,
    content_type: str | None = None,
) -> list[ApiRequest]:
    """The authorizer's attributes of one HTTP request (usually one; a server-side apply is both a patch and a
    create, since it creates the object when it is missing and the API server asks for both). `url` may be absolute
    or a path, with or without its query; `query` adds parameters passed apart from it (the `kubernetes` client
    does so for GETs)."""
    split = urllib.parse.urlsplit(url)
    params = urllib.parse.parse_qs(split.query)
    for key, value in query.items() if isinstance(query, Mapping) else query or ():
        params.setdefault(key, []).append(str(value))
    method = method.upper()
    path = split.path or "/"
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        rest = []
    if not rest:  # /api, /apis/<group>/<version>, /version, /openapi/...: discovery and the like
        verb = {"HEAD": "head"}.get(method, method.lower())
        return [ApiRequest(verb=verb, path=path)]

    watch = False
    if rest[0] == "watch":  # the old /watch/ prefix
        watch, rest = True, rest[1:]
    namespace: str | None = None
    if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in NAMESPACE_SUBRESOURCES:
        namespace, rest = rest[1], rest[2:]
    resource_name = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    subresource = "/".join(rest[2:])
    watch = watch or any(v.lower() in ("true", "1") for v in params.get("watch", []))

    if watch:
        verbs = ["watch"]
    elif method in ("GET", "HEAD"):
        verbs = ["get" if name else "list"]
    elif method == "POST":
        verbs = ["create"]
    elif method == "PUT":
        verbs = ["update"]
    elif method == "PATCH":
        applied = (content_type or "").split(";")[0].strip().lower() == APPLY_PATCH
        verbs = ["patch", "create"] if applied else ["patch"]
    elif method == "DELETE":
        verbs = ["delete" if name else "deletecollection"]
    else:
        return []
    base = ApiRequest(
        verb="",
        group=group,
        version=version,
        resource=resource_name,
        subresource=subresource,
        namespace=namespace,
        name=name,
    )
    return [replace(base, verb=v) for v in verbs]


def current_test() -> str:
    """The test running now (pytest's PYTEST_CURRENT_TEST, readable from any thread), without its phase. The
    operator works in the background, so this names the test during which a request was first made."""
    running = os.environ.get("PYTEST_CURRENT_TEST", "")
    return running.rsplit(" (", 1)[0] if running else "(outside any test)"


@dataclass(frozen=True)
class Recorded:
    request: ApiRequest
    test: str
    """The test during which it was first made."""


class Recorder:
    """The operator's distinct requests (by `ApiRequest.key`), first one of each kept. Thread-safe: kopf's loop,
    the reconcile threads and the webhook's loop record at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, str, str, str, bool, str], Recorded] = {}
        self._captures: list[list[ApiRequest]] = []

    def add(self, requests: Iterable[ApiRequest]) -> None:
        for request in requests:
            with self._lock:
                if request.key not in self._seen:
                    self._seen[request.key] = Recorded(request, current_test())
                for capture in self._captures:
                    capture.append(request)

    @contextlib.contextmanager
    def capture(self) -> Iterator[list[ApiRequest]]:
        """Every request recorded while open, each one (the recorder itself keeps only the first of a kind): what
        a test needs to see a request in its own namespace."""
        captured: list[ApiRequest] = []
        with self._lock:
            self._captures.append(captured)
        try:
            yield captured
        finally:
            with self._lock:
                self._captures.remove(captured)

    def __len__(self) -> int:
        with self._lock:
            return len(self._seen)

    @property
    def recorded(self) -> list[Recorded]:
        with self._lock:
            return list(self._seen.values())

    def made(self, verb: str, resource: str, *, group: str = "", subresource: str = "") -> list[ApiRequest]:
        """The recorded requests of that verb on that resource."""
        return [
            r.request
            for r in self.recorded
            if (r.request.verb, r.request.group, r.request.resource, r.request.subresource)
            == (verb, group, resource, subresource)
        ]


def _content_type(headers: Mapping[str, str] | None) -> str | None:
    for key, value in (headers or {}).items():
        if key.lower() == "content-type":
            return value
    return None


@contextlib.contextmanager
def recording(recorder: Recorder) -> Iterator[Recorder]:
    """While open, the operator's requests through either client go into `recorder`; the clients are restored on
    exit. Each wrapper only reads the request's method, URL and content type: it never changes or delays it."""
    from kopf._cogs.clients import api as kopf_api
    from kubernetes.client.rest import RESTClientObject

    rest_request = RESTClientObject.request
    kopf_request = kopf_api.request

    def recorded_rest(
        self: Any,
        method: str,
        url: str,
        query_params: Any = None,
        headers: Mapping[str, str] | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        if OPERATOR.get():
            recorder.add(parse(method, url, query_params, _content_type(headers)))
        called = CALLED.get()
        if called is not None:
            called.extend(parse(method, url, query_params, _content_type(headers)))
        return rest_request(self, method, url, query_params, headers, *args, **kwargs)

    async def recorded_kopf(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if OPERATOR.get():
            recorder.add(parse(method, url, content_type=_content_type(kwargs.get("headers"))))
        return await kopf_request(method, url, *args, **kwargs)

    RESTClientObject.request = recorded_rest
    kopf_api.request = recorded_kopf
    try:
        yield recorder
    finally:
        RESTClientObject.request = rest_request
        kopf_api.request = kopf_request


def as_operator(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call `function` in a copy of the current context marked as the operator's: what it starts (a thread's
    loop, a task scheduled from here) carries the mark."""
    context = contextvars.copy_context()
    context.run(OPERATOR.set, True)
    return context.run(function, *args, **kwargs)


def requests_of(function: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, list[ApiRequest]]:
    """Call `function` (a reconcile a test runs itself, beside the operator) and return its result with every API
    request it made through the `kubernetes` client, each one: the operator's daemon may write the same objects
    meanwhile, so a resourceVersion cannot tell whose write it was, and this can. Only while `recording` is
    open (the `operator` fixture): outside it the list stays empty."""
    called: list[ApiRequest] = []
    context = contextvars.copy_context()
    context.run(CALLED.set, called)
    return context.run(function, *args, **kwargs), called


def operator_runner(args: list[str], **kwargs: Any) -> Any:
    """kopf's KopfRunner whose thread is marked as the operator's. A new thread starts with an empty context, so
    the mark is set inside it, before kopf makes its loop: every task kopf starts inherits it. (KopfRunner runs
    the CLI in its `_target` method; the integration test of the recorder fails if that ever changes.)"""
    from kopf.testing import KopfRunner

    class OperatorRunner(KopfRunner):
        def _target(self) -> None:
            OPERATOR.set(True)
            super()._target()

    return OperatorRunner(args, **kwargs)


# -- the chart's answer ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class InstallMode:
    """One way to install the chart. `watched` None: all namespaces; otherwise the one namespace watched."""

    name: str
    watched: str | None

    def values(self) -> dict[str, Any]:
        return {} if self.watched is None else {"watchNamespaces": [self.watched]}


def scopes(k8s: Any) -> dict[tuple[str, str], bool]:
    """Whether each (group, resource) the API server serves is namespaced, from its discovery."""
    import json

    found: dict[tuple[str, str], bool] = {}

    def read(path: str) -> Any:
        response = k8s.client.call_api(
            path, "GET", auth_settings=["BearerToken"], _preload_content=False, _return_http_data_only=True
        )
        return json.loads(response.data)

    for version in read("/api").get("versions") or []:
        for res in read(f"/api/{version}").get("resources") or []:
            found[("", res["name"].split("/")[0])] = bool(res.get("namespaced"))
    for group in read("/apis").get("groups") or []:
        for version in group.get("versions") or []:
            for res in read(f"/apis/{version['groupVersion']}").get("resources") or []:
                found.setdefault((group["name"], res["name"].split("/")[0]), bool(res.get("namespaced")))
    return found


def review_attributes(
    request: ApiRequest, mode: InstallMode, namespaced: Mapping[tuple[str, str], bool]
) -> dict[str, Any]:
    """The SubjectAccessReview spec's attributes for `request` under `mode`. A namespaced kind is asked in the
    request's namespace when the chart is installed for all of them; installed for one namespace, in that one
    (kopf then lists and watches each namespace it serves, and the handlers' lists across all namespaces fall back
    to their own namespace when refused). Everything cluster-scoped is asked cluster-wide."""
    if not request.resource:
        return {"nonResourceAttributes": {"path": request.path, "verb": request.verb}}
    attributes: dict[str, Any] = {
        "verb": request.verb,
        "group": request.group,
        "version": request.version,
        "resource": request.resource,
        "subresource": request.subresource,
        "name": request.name,
    }
    if namespaced.get((request.group, request.resource), request.namespace is not None):
        where = request.namespace if mode.watched is None else mode.watched
        if where is not None:
            attributes["namespace"] = where
    return {"resourceAttributes": attributes}


def binding_probes(objects: Iterable[Mapping[str, Any]], account: str, account_namespace: str) -> list[dict[str, Any]]:
    """For each of the service account's bindings among the chart's `objects`, the review attributes of one
    request its role grants (its first rule's first verb, resource and name), where the binding grants it: all
    allowed once the authorizer has seen every role and binding applied."""
    objects = list(objects)
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o for o in objects}
    probes = []
    for binding in objects:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        subject = {"kind": "ServiceAccount", "name": account, "namespace": account_namespace}
        if not any({k: s.get(k) for k in subject} == subject for s in binding.get("subjects") or []):
            continue
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace")
        role = roles.get((ref["kind"], namespace if ref["kind"] == "Role" else None, ref["name"]))
        if role is None or not role.get("rules"):
            continue
        rule = role["rules"][0]
        resource_name, _, subresource = rule["resources"][0].partition("/")
        attributes = {
            "verb": rule["verbs"][0],
            "group": rule["apiGroups"][0],
            "resource": resource_name,
            "subresource": subresource,
            "name": (rule.get("resourceNames") or [""])[0],
        }
        if namespace:
            attributes["namespace"] = namespace
        probes.append({"resourceAttributes": attributes})
    return probes


@contextlib.contextmanager
def chart_rbac(k8s: Any, helm: Any, mode: InstallMode, namespace: str) -> Iterator[str]:
    """The chart's RBAC objects (and nothing else) rendered for `mode` and applied in `namespace`; yields the
    service account's name once the API server's authorizer has seen them. Everything applied is deleted
    afterwards."""
    from kubernetes.dynamic.exceptions import NotFoundError

    from strata_testsupport.kube import resource, service_account_allowed, wait_for

    release = f"rbac{uuid.uuid4().hex[:6]}"
    objects = [o for o in helm.template(mode.values(), release=release, namespace=namespace) if o["kind"] in RBAC_KINDS]
    (account,) = [o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"]
    try:
        for obj in objects:
            meta = obj["metadata"]
            resource(k8s, obj["apiVersion"], obj["kind"]).server_side_apply(
                body=obj,
                name=meta["name"],
                namespace=meta.get("namespace"),
                field_manager="strata-rbac-check",
                force_conflicts=True,
            )
        probes = binding_probes(objects, account, namespace)
        assert probes, f"the chart ({mode.name}) binds no role to its service account {account}"
        wait_for(
            lambda: all(service_account_allowed(k8s, namespace, account, p) for p in probes),
            timeout=AUTHORIZER_CATCH_UP_SECONDS,
            what=f"the authorizer to grant the chart's rules ({mode.name}) to {namespace}/{account}",
        )
        yield account
    finally:
        for obj in objects:
            if obj["metadata"].get("namespace"):
                continue  # goes with its namespace
            with contextlib.suppress(NotFoundError):
                resource(k8s, obj["apiVersion"], obj["kind"]).delete(name=obj["metadata"]["name"])


def chart_denials(k8s: Any, recorded: Iterable[Recorded], helm: Any = None, tmp: Path | None = None) -> list[str]:
    """Each recorded request that the chart's RBAC does not grant, per install mode, as a line naming the mode,
    the request and the test during which it was made. `k8s` is an admin DynamicClient of the API server to ask;
    `helm` a `strata_testsupport.helm.Helm` (by default the project's, in a temporary directory)."""
    import tempfile

    from strata_testsupport.helm import Helm, helm_path
    from strata_testsupport.kube import resource, service_account_allowed

    recorded = list(recorded)
    if not recorded:
        return []
    with contextlib.ExitStack() as stack:
        if helm is None:
            home = tmp or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="strata-rbac-helm-")))
            helm = Helm(helm_path(), home)
        namespaced = scopes(k8s)
        namespaces = resource(k8s, "v1", "Namespace")
        denials = []
        modes = (InstallMode("cluster-wide", None), InstallMode("namespaced", f"rbac-watched-{uuid.uuid4().hex[:6]}"))
        for mode in modes:
            release_namespace = f"rbac-{uuid.uuid4().hex[:8]}"
            made = [release_namespace] + ([mode.watched] if mode.watched else [])
            for name in made:
                namespaces.create(body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
            try:
                with chart_rbac(k8s, helm, mode, release_namespace) as account:
                    denials += [
                        f"{mode.name}: {r.request.describe()} (first made during {r.test})"
                        for r in recorded
                        if not service_account_allowed(
                            k8s, release_namespace, account, review_attributes(r.request, mode, namespaced)
                        )
                    ]
            finally:
                for name in made:
                    namespaces.delete(name=name)
        return denials
