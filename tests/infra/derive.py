"""What the launcher's code asks of each cloud, read from the code itself.

AWS. The provider modules and the doctor are parsed (``ast``); every call of a method on a boto3
client (``aws.client("sagemaker").create_training_job(...)``, or a variable bound to such a
client, or ``get_paginator("list_service_quotas")``) is an operation of that service, named by
botocore's own service model (``xform_name`` of each operation name). An operation's IAM action is
``<signing name>:<Operation>``, except where AWS documents otherwise (:data:`AWS_ACTIONS`); the
kind of resource each action acts on comes from the Service Authorization Reference
(:data:`ACTION_RESOURCES`). Both tables are checked to cover every operation found: a new call
without a rule fails the test instead of passing unchecked. What a request carries adds actions:
a member of shape ``RoleArn`` is an ``iam:PassRole`` of that role to the operation's service, a
``Tags`` member an ``AddTags`` (both read off botocore's input shape of the real dry-run request).
What the *execution role* must allow is derived from the same request: every S3 URI, the image,
the metric definitions and the log group the provider reads (:func:`execution_requests`), and a
guard fails on any ARN, S3 URI or image in the request no rule accounted for.

Google Cloud. There is no machine-readable map from client methods to IAM permissions, so
:data:`GCP_METHODS` is that table, with Google's documentation for each line; the test derives
which methods the code calls (attribute calls in the modules that are public methods of the
client classes used) and fails when one is missing from the table. The request adds
``iam.serviceAccounts.actAs`` for ``jobSpec.serviceAccount``, and what the job's own account must
do in the bucket.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from tests.infra.iam import Request

REPO = Path(__file__).resolve().parents[2]
AWS_MODULES = ("launcher/providers/sagemaker/provider.py", "launcher/providers/sagemaker/logs.py",
               "launcher/providers/sagemaker/_aws.py", "launcher/providers/sagemaker/doctor.py")
GCP_MODULES = ("launcher/providers/vertex/provider.py", "launcher/providers/vertex/logs.py",
               "launcher/providers/vertex/_gcp.py", "launcher/providers/vertex/doctor.py")


def module_name(path: Path) -> str:
    """What a call's ``module`` says: a provider package's ``provider.py`` by its package's name
    (sagemaker, vertex), any other file by its stem (_aws, logs, doctor)."""
    return path.parent.name if path.stem == "provider" else path.stem


# -- AWS: calls in the code --------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class ClientCall:
    module: str    # module_name: sagemaker, logs, _aws, doctor
    service: str   # boto3 client name
    method: str    # python method name
    line: int


def _client_service(node: ast.AST) -> str | None:
    """``<anything>.client("svc")`` -> "svc"."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "client" and node.args
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return node.args[0].value
    return None


def boto3_calls(path: Path) -> list[ClientCall]:
    """Every method call on a boto3 client in one file, function by function (a variable is a
    client from its assignment ``name = <x>.client("svc")`` on)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    calls: list[ClientCall] = []
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    for function in functions:
        bound: dict[str, str] = {}
        for node in ast.walk(function):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                    isinstance(node.targets[0], ast.Name):
                service = _client_service(node.value)
                if service:
                    bound[node.targets[0].id] = service
        for node in ast.walk(function):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            # ``<aws>.read("svc", "operation", ...)``: a status read through Aws.read's deadline.
            if (node.func.attr == "read" and len(node.args) >= 2
                    and all(isinstance(a, ast.Constant) and isinstance(a.value, str)
                            for a in node.args[:2])):
                calls.append(ClientCall(module_name(path), str(node.args[0].value),  # type: ignore[attr-defined]
                                        str(node.args[1].value), node.lineno))  # type: ignore[attr-defined]
                continue
            receiver = node.func.value
            service = _client_service(receiver) or (
                bound.get(receiver.id) if isinstance(receiver, ast.Name) else None)
            if service is None:
                continue
            method = node.func.attr
            if method == "get_paginator" and node.args and isinstance(node.args[0], ast.Constant):
                method = str(node.args[0].value)
            calls.append(ClientCall(module_name(path), service, method, node.lineno))
    return sorted(set(calls))


@cache
def _service_model(service: str) -> Any:
    import botocore.session

    return botocore.session.get_session().get_service_model(service)


def operation_of(service: str, method: str) -> str | None:
    """The API operation a boto3 client method calls (None: a helper such as ``close``)."""
    from botocore import xform_name

    model = _service_model(service)
    names = {xform_name(op): op for op in model.operation_names}
    return names.get(method)


def iam_prefix(service: str) -> str:
    """The service's IAM action prefix: botocore's signing name (sagemaker, s3, logs, iam,
    servicequotas, sts ...)."""
    model = _service_model(service)
    return str(model.signing_name or model.endpoint_prefix)


#: Operations whose IAM actions are not "<prefix>:<Operation>": (action, resource kind) pairs.
#: S3: https://docs.aws.amazon.com/AmazonS3/latest/API/API_HeadObject.html ("Permissions": you
#:   need s3:GetObject; without s3:ListBucket on the bucket a missing key answers 403, not the 404
#:   the provider's upload check relies on), .../API_HeadBucket.html (s3:ListBucket),
#:   .../API_PutObject.html, .../API_DeleteObject.html, and
#:   https://docs.aws.amazon.com/AmazonS3/latest/userguide/using-with-s3-policy-actions.html
#: STS: https://docs.aws.amazon.com/STS/latest/APIReference/API_GetCallerIdentity.html ("No
#:   permissions are required to perform this operation").
AWS_ACTIONS: dict[tuple[str, str], tuple[tuple[str, str], ...]] = {
    ("s3", "HeadObject"): (("s3:GetObject", "object"), ("s3:ListBucket", "bucket")),
    ("s3", "GetObject"): (("s3:GetObject", "object"),),
    ("s3", "PutObject"): (("s3:PutObject", "object"),),
    ("s3", "DeleteObject"): (("s3:DeleteObject", "object"),),
    ("s3", "HeadBucket"): (("s3:ListBucket", "bucket"),),
    ("sts", "GetCallerIdentity"): (),
}
#: Services whose every operation is "<prefix>:<Operation>"; an operation of any other service
#: must be in AWS_ACTIONS (so a new S3 call cannot slip through with a made-up action name).
AWS_REGULAR_SERVICES = frozenset({"sagemaker", "logs", "iam", "service-quotas"})

#: The kind of resource each action acts on (AWS Service Authorization Reference, "Resource
#: types" column of each action): https://docs.aws.amazon.com/service-authorization/latest/
#: reference/list_amazonsagemaker.html, list_awsidentityandaccessmanagementiam.html,
#: list_amazoncloudwatchlogs.html, list_servicequotas.html ("*": no resource type).
ACTION_RESOURCES = {
    "sagemaker:CreateTrainingJob": "job", "sagemaker:DescribeTrainingJob": "job",
    "sagemaker:StopTrainingJob": "job", "sagemaker:AddTags": "job",
    "iam:GetRole": "role", "iam:PassRole": "role", "iam:SimulatePrincipalPolicy": "self",
    "logs:DescribeLogStreams": "log-group", "logs:GetLogEvents": "log-stream",
    "logs:FilterLogEvents": "log-group",
    "servicequotas:ListServiceQuotas": "*",
}


@dataclass(frozen=True, order=True)
class Action:
    """An IAM action some module's code needs, and the kind of resource it acts on."""

    action: str
    resource: str
    module: str
    source: str  # the call or request member it comes from


def aws_actions(modules: Iterable[str] = AWS_MODULES) -> tuple[list[Action], list[str]]:
    """(actions the calls in ``modules`` need, problems: operations no rule knows)."""
    actions, problems = _aws_actions(tuple(modules))
    return list(actions), list(problems)


@cache
def _aws_actions(modules: tuple[str, ...]) -> tuple[tuple[Action, ...], tuple[str, ...]]:
    actions: list[Action] = []
    problems: list[str] = []
    for relative in modules:
        for call in boto3_calls(REPO / relative):
            operation = operation_of(call.service, call.method)
            if operation is None:
                continue
            where = f"{relative}:{call.line} {call.service}.{call.method}"
            rule = AWS_ACTIONS.get((call.service, operation))
            if rule is None:
                if call.service not in AWS_REGULAR_SERVICES:
                    problems.append(f"{where}: no IAM action known for {operation}")
                    continue
                name = f"{iam_prefix(call.service)}:{operation}"
                if name not in ACTION_RESOURCES:
                    problems.append(f"{where}: {name} has no resource kind in ACTION_RESOURCES")
                    continue
                rule = ((name, ACTION_RESOURCES[name]),)
            actions += [Action(a, kind, call.module, where) for a, kind in rule]
    return tuple(sorted(set(actions))), tuple(problems)


def request_actions(service: str, operation: str, kwargs: dict[str, Any], module: str
                    ) -> list[Action]:
    """Actions a request needs beyond its operation's own, from botocore's input shape:
    a ``RoleArn`` shape is passed to the service (iam:PassRole); ``Tags`` on a create need
    ``<prefix>:AddTags`` (https://docs.aws.amazon.com/sagemaker/latest/dg/security_iam_id-based-policy-examples.html
    "tagging on creation")."""
    shape = _service_model(service).operation_model(operation).input_shape
    found: list[Action] = []
    for name, member in shape.members.items():
        if name not in kwargs:
            continue
        if member.name == "RoleArn":
            found.append(Action("iam:PassRole", "role", module, f"{operation}.{name}"))
        if name == "Tags" and kwargs[name]:
            found.append(Action(f"{iam_prefix(service)}:AddTags", ACTION_RESOURCES.get(
                f"{iam_prefix(service)}:AddTags", "job"), module, f"{operation}.{name}"))
    return found


# -- AWS: what the execution role must allow ---------------------------------------------------

_S3 = re.compile(r"^s3://([^/]+)/?(.*)$")
_IMAGE = re.compile(r"^(\d{12})\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/([^:@]+)[:@].+$")


def _s3_object(uri: str, partition: str) -> tuple[str, str, str]:
    match = _S3.match(uri)
    assert match, uri
    bucket, key = match.group(1), match.group(2)
    return bucket, key, f"arn:{partition}:s3:::{bucket}/{key}"


def execution_requests(kwargs: dict[str, Any], region: str, account: str, partition: str,
                       log_group: str, code_object: str) -> tuple[list[Request], set[str]]:
    """What a training job made from ``kwargs`` does as its role, per SageMaker's documented
    execution-role permissions (https://docs.aws.amazon.com/sagemaker/latest/dg/sagemaker-roles.html
    "CreateTrainingJob API: Execution Role Permissions"), and the request values accounted for.
    ``code_object`` is the package's S3 URI (the one object in the code channel)."""
    requests: list[Request] = []
    used: set[str] = set()

    def listing(uri: str, why: str) -> None:
        bucket, key, _ = _s3_object(uri, partition)
        requests.append(Request("s3:ListBucket", f"arn:{partition}:s3:::{bucket}",
                                {"s3:prefix": key}, why))

    for channel in kwargs.get("InputDataConfig", []):
        uri = channel["DataSource"]["S3DataSource"]["S3Uri"]
        used.add(uri)
        listing(uri, f"channel {channel['ChannelName']}: list")
        inside = code_object if code_object.startswith(uri) else uri.rstrip("/") + "/data"
        requests.append(Request("s3:GetObject", _s3_object(inside, partition)[2], {},
                                f"channel {channel['ChannelName']}: download"))
    output = kwargs.get("OutputDataConfig", {}).get("S3OutputPath")
    if output:
        used.add(output)
        key = f"{output.rstrip('/')}/{kwargs['TrainingJobName']}/output/model.tar.gz"
        requests.append(Request("s3:PutObject", _s3_object(key, partition)[2], {}, "output"))
    checkpoint = kwargs.get("CheckpointConfig", {}).get("S3Uri")
    if checkpoint:
        used.add(checkpoint)
        listing(checkpoint, "checkpoints: list on resume")
        arn = _s3_object(checkpoint.rstrip("/") + "/step_1.pt", partition)[2]
        requests += [Request("s3:GetObject", arn, {}, "checkpoints: download on resume"),
                     Request("s3:PutObject", arn, {}, "checkpoints: upload")]
    image = kwargs["AlgorithmSpecification"]["TrainingImage"]
    used.add(image)
    match = _IMAGE.match(image)
    assert match, f"not an ECR image: {image}"
    repo = f"arn:{partition}:ecr:{match.group(2)}:{match.group(1)}:repository/{match.group(3)}"
    requests.append(Request("ecr:GetAuthorizationToken", "*", {}, "image: log in to ECR"))
    requests += [Request(a, repo, {}, "image: pull") for a in
                 ("ecr:BatchCheckLayerAvailability", "ecr:GetDownloadUrlForLayer",
                  "ecr:BatchGetImage")]
    group = f"arn:{partition}:logs:{region}:{account}:log-group:{log_group}"
    stream = f"{group}:log-stream:{kwargs['TrainingJobName']}/algo-1-1700000000"
    requests += [Request("logs:CreateLogGroup", group, {}, "logs: the group"),
                 Request("logs:DescribeLogStreams", group, {}, "logs: find the stream"),
                 Request("logs:CreateLogStream", stream, {}, "logs: the stream"),
                 Request("logs:PutLogEvents", stream, {}, "logs: the output")]
    if kwargs["AlgorithmSpecification"].get("MetricDefinitions"):
        requests.append(Request("cloudwatch:PutMetricData", "*",
                                {"cloudwatch:namespace": "/aws/sagemaker/TrainingJobs"},
                                "metric definitions"))
    used.add(kwargs["RoleArn"])  # the role itself: the launcher's PassRole, not the job's
    return requests, used


def resource_strings(value: Any) -> set[str]:
    """Every string in a request that names an AWS resource (an ARN, an S3 URI, an image)."""
    found: set[str] = set()
    if isinstance(value, dict):
        for item in value.values():
            found |= resource_strings(item)
    elif isinstance(value, list):
        for item in value:
            found |= resource_strings(item)
    elif isinstance(value, str) and (value.startswith(("arn:", "s3://"))
                                     or ".dkr.ecr." in value):
        found.add(value)
    return found


# -- Google Cloud ------------------------------------------------------------------------------


#: Client library method -> (permission, where it is checked). Sources, one per API:
#: JobService (aiplatform.customJobs.*): https://cloud.google.com/vertex-ai/docs/general/access-control
#:   ("Custom training" permissions: create, get, list, cancel);
#: Cloud Logging entries.list: https://cloud.google.com/logging/docs/access-control
#:   ("logging.logEntries.list" for entries.list / ListLogEntries);
#: Cloud Storage JSON API: https://cloud.google.com/storage/docs/access-control/iam-json
#:   (buckets.get: storage.buckets.get; objects.get (Blob.exists): storage.objects.get;
#:   objects.insert without overwrite (ifGenerationMatch=0): storage.objects.create;
#:   buckets.testIamPermissions: no permission).
#: Methods that make no API call (factories) map to ().
GCP_METHODS: dict[str, tuple[tuple[str, str], ...]] = {
    "create_custom_job": (("aiplatform.customJobs.create", "project"),),
    "get_custom_job": (("aiplatform.customJobs.get", "project"),),
    "list_custom_jobs": (("aiplatform.customJobs.list", "project"),),
    "cancel_custom_job": (("aiplatform.customJobs.cancel", "project"),),
    "list_log_entries": (("logging.logEntries.list", "project"),),
    "list_entries": (("logging.logEntries.list", "project"),),
    "lookup_bucket": (("storage.buckets.get", "bucket"),),
    "get_bucket": (("storage.buckets.get", "bucket"),),
    # Blob.exists (objects.get); Bucket.exists would be buckets.get: the name alone cannot tell.
    "exists": (("storage.objects.get", "bucket"), ("storage.buckets.get", "bucket")),
    # Bucket.get_blob: objects.get (the object's metadata: its md5Hash and size).
    "get_blob": (("storage.objects.get", "bucket"),),
    "upload_from_file": (("storage.objects.create", "bucket"),),
    "test_iam_permissions": (),
    "bucket": (),
    "blob": (),
}


def _gcp_client_classes() -> list[type]:
    from google.cloud import logging as cloud_logging
    from google.cloud import storage
    from google.cloud.aiplatform_v1.services.job_service import JobServiceClient
    from google.cloud.logging_v2.services.logging_service_v2 import LoggingServiceV2Client

    return [JobServiceClient, LoggingServiceV2Client, cloud_logging.Client, storage.Client,
            storage.Bucket, storage.Blob]


def gcp_client_methods() -> set[str]:
    """Public methods of the Google client classes the providers use."""
    names: set[str] = set()
    for cls in _gcp_client_classes():
        names |= {n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n))}
    return names


@dataclass(frozen=True, order=True)
class MethodCall:
    module: str
    method: str
    line: int


def _foreign_names(tree: ast.Module) -> set[str]:
    """Names imported from outside google.* (tarfile, hashlib, json ...): a method called on
    them, or on a value made by them, is not a Google client call whatever its name."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names
                      if not a.name.startswith("google")}
        elif isinstance(node, ast.ImportFrom) and not (node.module or "").startswith("google"):
            names |= {a.asname or a.name for a in node.names}
    return names


def _root_name(node: ast.AST) -> str | None:
    """``a`` of ``a.b.c(...)``, ``a(...).b`` and the like."""
    while True:
        if isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Attribute):
            node = node.value
        elif isinstance(node, ast.Name):
            return node.id
        else:
            return None


def attribute_calls(path: Path) -> list[MethodCall]:
    """Method calls in one file, except those on values of non-Google modules (a variable
    bound, in the same function, to something a non-Google module made counts as one)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    foreign_modules = _foreign_names(tree)
    found: set[MethodCall] = set()
    top = ast.Module(body=[s for s in tree.body if not isinstance(
        s, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)], type_ignores=[])
    scopes = [top, *[n for n in ast.walk(tree)
                     if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]]
    for scope in scopes:
        foreign = set(foreign_modules)
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign) and _root_name(node.value) in foreign:
                foreign |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            if isinstance(node, ast.withitem) and _root_name(node.context_expr) in foreign \
                    and isinstance(node.optional_vars, ast.Name):
                foreign.add(node.optional_vars.id)
        for node in ast.walk(scope):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    _root_name(node.func.value) not in foreign:
                found.add(MethodCall(module_name(path), node.func.attr, node.lineno))
    return sorted(found)


@dataclass(frozen=True, order=True)
class Permission:
    permission: str
    scope: str     # project | bucket | service account
    module: str
    source: str


def gcp_permissions(modules: Iterable[str] = GCP_MODULES) -> tuple[list[Permission], list[str]]:
    """(permissions the calls in ``modules`` need, problems: client methods not in the table)."""
    found, problems = _gcp_permissions(tuple(modules))
    return list(found), list(problems)


@cache
def _gcp_permissions(modules: tuple[str, ...]) -> tuple[tuple[Permission, ...], tuple[str, ...]]:
    api = gcp_client_methods()
    found: list[Permission] = []
    problems: list[str] = []
    for relative in modules:
        for call in attribute_calls(REPO / relative):
            if call.method not in api:
                continue
            where = f"{relative}:{call.line} .{call.method}()"
            if call.method not in GCP_METHODS:
                problems.append(f"{where}: a Google client method with no permission in "
                                "GCP_METHODS")
                continue
            found += [Permission(p, scope, call.module, where)
                      for p, scope in GCP_METHODS[call.method]]
    return tuple(sorted(set(found))), tuple(problems)


#: Permissions the predefined roles the module grants include, as far as the tests rely on them
#: (https://cloud.google.com/iam/docs/roles-permissions/storage#storage.objectUser,
#: https://cloud.google.com/iam/docs/roles-permissions/cloudquotas#cloudquotas.viewer).
PREDEFINED_ROLES_INCLUDE: dict[str, frozenset[str]] = {
    "roles/storage.objectUser": frozenset({
        "storage.objects.create", "storage.objects.delete", "storage.objects.get",
        "storage.objects.list", "storage.objects.update",
    }),
    "roles/cloudquotas.viewer": frozenset({"cloudquotas.quotas.get"}),
}

#: What a Vertex AI job does in the bucket as its service account, from the request: it reads
#: the staged archives (LAUNCH_STAGED, through /gcs or the storage library) and writes
#: checkpoints and output under baseOutputDirectory through Cloud Storage FUSE, which renames
#: (a copy and a delete) and lists (https://cloud.google.com/storage/docs/cloud-storage-fuse/
#: overview#permissions).
JOB_BUCKET_PERMISSIONS = ("storage.objects.get", "storage.objects.list",
                          "storage.objects.create", "storage.objects.delete")

