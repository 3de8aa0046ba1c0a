"""The Terraform modules of infra/ evaluated for concrete settings, and the launcher's real dry-run
requests for the resources those modules create: what test_policies.py and the doctor tests
compare."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.plan.plan import Plan
from launcher.providers.base import Job
from launcher.render import RenderedJob
from tests.infra.hcl import Evaluator, load_module, load_tfvars

REPO = Path(__file__).resolve().parents[2]
AWS_MODULE = REPO / "infra" / "aws"
GCP_MODULE = REPO / "infra" / "gcp"
ACCOUNT = "123456789012"
PROJECT_NUMBER = "424242424242"


def partition_of(region: str) -> str:
    if region.startswith("cn-"):
        return "aws-cn"
    return "aws-us-gov" if region.startswith("us-gov-") else "aws"


# -- AWS ---------------------------------------------------------------------------------------


def _aws_hooks(account: str, partition: str) -> dict[str, Any]:
    """Computed attributes, as AWS returns them."""

    def named(kind: str) -> Any:
        def hook(ev: Evaluator, body: dict[str, Any], scope: dict[str, Any]) -> dict[str, Any]:
            name = ev.value(body["name"], scope)
            return {"arn": f"arn:{partition}:iam::{account}:{kind}/{name}", "id": name,
                    "name": name}
        return hook

    def bucket(ev: Evaluator, body: dict[str, Any], scope: dict[str, Any]) -> dict[str, Any]:
        name = ev.value(body["bucket"], scope)
        return {"id": name, "bucket": name, "arn": f"arn:{partition}:s3:::{name}"}

    def oidc(ev: Evaluator, body: dict[str, Any], scope: dict[str, Any]) -> dict[str, Any]:
        host = ev.value(body["url"], scope).removeprefix("https://")
        return {"arn": f"arn:{partition}:iam::{account}:oidc-provider/{host}"}

    return {"aws_iam_role": named("role"), "aws_iam_policy": named("policy"),
            "aws_s3_bucket": bucket, "aws_iam_openid_connect_provider": oidc}


def aws_module(region: str = "us-east-1", example: bool = False, **variables: Any) -> Evaluator:
    """infra/aws for ``region`` in account :data:`ACCOUNT`; ``example`` adds example.tfvars
    (every option on)."""
    values = load_tfvars(AWS_MODULE / "example.tfvars") if example else {}
    values.update(variables)
    partition = partition_of(region)
    facts = {"data.aws_caller_identity.current.account_id": ACCOUNT,
             "data.aws_region.current.name": region,
             "data.aws_partition.current.partition": partition}
    return Evaluator(load_module(AWS_MODULE), values, facts, _aws_hooks(ACCOUNT, partition))


def output(ev: Evaluator, name: str) -> Any:
    return ev.value(ev.module.outputs[name]["value"], {})


# -- GCP ---------------------------------------------------------------------------------------


def _gcp_hooks() -> dict[str, Any]:
    def service_account(ev: Evaluator, body: dict[str, Any], scope: dict[str, Any]
                        ) -> dict[str, Any]:
        project = ev.value(body["project"], scope)
        email = f"{ev.value(body['account_id'], scope)}@{project}.iam.gserviceaccount.com"
        return {"email": email, "name": f"projects/{project}/serviceAccounts/{email}",
                "id": f"projects/{project}/serviceAccounts/{email}",
                "member": f"serviceAccount:{email}"}

    def custom_role(ev: Evaluator, body: dict[str, Any], scope: dict[str, Any]
                    ) -> dict[str, Any]:
        project, role_id = ev.value(body["project"], scope), ev.value(body["role_id"], scope)
        name = f"projects/{project}/roles/{role_id}"
        return {"name": name, "id": name}

    def pool(ev: Evaluator, body: dict[str, Any], scope: dict[str, Any]) -> dict[str, Any]:
        pool_id = ev.value(body["workload_identity_pool_id"], scope)
        return {"name": f"projects/{PROJECT_NUMBER}/locations/global/workloadIdentityPools/"
                        f"{pool_id}"}

    def pool_provider(ev: Evaluator, body: dict[str, Any], scope: dict[str, Any]
                      ) -> dict[str, Any]:
        return {"name": f"projects/{PROJECT_NUMBER}/locations/global/workloadIdentityPools/"
                        f"{ev.value(body['workload_identity_pool_id'], scope)}/providers/"
                        f"{ev.value(body['workload_identity_pool_provider_id'], scope)}"}

    def bucket(ev: Evaluator, body: dict[str, Any], scope: dict[str, Any]) -> dict[str, Any]:
        name = ev.value(body["name"], scope)
        return {"id": name, "url": f"gs://{name}"}

    return {"google_service_account": service_account,
            "google_project_iam_custom_role": custom_role,
            "google_iam_workload_identity_pool": pool,
            "google_iam_workload_identity_pool_provider": pool_provider,
            "google_storage_bucket": bucket}


def gcp_module(example: bool = True, **variables: Any) -> Evaluator:
    values = load_tfvars(GCP_MODULE / "example.tfvars") if example else {}
    values.update(variables)
    return Evaluator(load_module(GCP_MODULE), values, {}, _gcp_hooks())


@dataclass(frozen=True)
class Binding:
    """One IAM grant of the GCP module: where (project / gs://bucket / a service account's
    email), to whom, which role."""

    scope: str
    member: str
    role: str


def gcp_bindings(ev: Evaluator) -> list[Binding]:
    found: list[Binding] = []
    module = ev.module
    for (rtype, name) in module.resources:
        for args in ev.evaluated("resource", rtype, name) if rtype in (
                "google_project_iam_member", "google_storage_bucket_iam_member",
                "google_service_account_iam_member") else []:
            if rtype == "google_project_iam_member":
                scope = f"projects/{args['project']}"
            elif rtype == "google_storage_bucket_iam_member":
                scope = f"gs://{args['bucket']}"
            else:
                scope = args["service_account_id"].rsplit("/", 1)[-1]
            found.append(Binding(scope, args["member"], args["role"]))
    return found


def gcp_custom_roles(ev: Evaluator) -> dict[str, frozenset[str]]:
    roles: dict[str, frozenset[str]] = {}
    for (rtype, name) in ev.module.resources:
        if rtype == "google_project_iam_custom_role":
            for args in ev.evaluated("resource", rtype, name):
                roles[f"projects/{args['project']}/roles/{args['role_id']}"] = frozenset(
                    args["permissions"])
    return roles


# -- the launcher's requests -------------------------------------------------------------------


def stub_job(tmp_path: Path, strategy: str = "ddp", *, run_id: str = "train-20260801-120000-ab12",
             machine: str = "ml.p4d.24xlarge", nodes: int = 2, gpus_per_node: int = 8) -> Job:
    """A rendered attempt whose request does not depend on the script's text (a stub render,
    so every strategy, SMP v2 included, makes a request)."""
    plan = Plan(strategy=strategy, machine=machine, nodes=nodes,  # type: ignore[arg-type]
                gpus_per_node=gpus_per_node, micro_batch_size=4, grad_accum_steps=1,
                global_batch_size=64, precision="bf16_mixed", optimizer="adamw",
                activation_checkpointing=False, steps=10, lr=3e-4, cost_per_hour_usd=40.0)
    code = tmp_path / "code"
    code.mkdir(parents=True, exist_ok=True)
    (code / "train.py").write_text("print('train')\n")
    rendered = RenderedJob(files={"plan.json": "{}\n", "launch_train.py": "print()\n"},
                           entrypoint="launch_train.py", env={"LAUNCH_STRATEGY": strategy})
    attempt_dir = tmp_path / "state" / "runs" / run_id / "attempt-1"
    rendered.write(attempt_dir / "job")
    return Job(run_id=run_id, attempt=1, plan=plan, rendered=rendered,
               job_dir=attempt_dir / "job", attempt_dir=attempt_dir,
               checkpoint_dir=attempt_dir.parent / "checkpoints", code_dir=code)


def sagemaker_request(ev: Evaluator, region: str, tmp_path: Path, strategy: str = "ddp") -> Any:
    """The provider's dry run with the settings the module's outputs give."""
    from launcher.providers.sagemaker import SageMakerProvider

    settings = {"region": region, "bucket": output(ev, "bucket"), "role": output(ev, "role"),
                "s3_prefix": output(ev, "s3_prefix"), "job_prefix": output(ev, "job_prefix")}
    provider = SageMakerProvider.from_settings(settings, {})
    return provider.dryrun(stub_job(tmp_path, strategy))


def vertex_request(ev: Evaluator, tmp_path: Path) -> Any:
    from launcher.providers.vertex import VertexProvider

    settings = {k: output(ev, k) for k in ("project", "region", "bucket", "service_account")}
    provider = VertexProvider.from_settings(settings, {})
    return provider.dryrun(stub_job(tmp_path, "ddp", machine="a2-highgpu-2g", nodes=1,
                                    gpus_per_node=2))
