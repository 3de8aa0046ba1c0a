"""The SageMaker provider, everything about AWS in one package.

``provider.py`` (:class:`SageMakerProvider`: the request, sending, following, stopping),
``logs.py`` (reading CloudWatch Logs: every stream of a job and the event channel),
``settings.py`` (the run's settings, job names and states), ``package.py`` (the code package),
``doctor.py`` (`launch doctor --provider sagemaker`), ``bootstrap.py`` (``launch_sagemaker.py``,
what starts torchrun on every host, shipped as package data), ``sdk.py`` (the training image
URIs, from sagemaker-core) and ``_aws.py`` (how one talks to AWS). Importing it imports no AWS
SDK: boto3 is imported by the calls that need it, sagemaker-core by the dry run alone.
"""

from launcher.providers.sagemaker.logs import FILTER_PATTERN_MAX, LOG_GROUP, event_filter
from launcher.providers.sagemaker.package import (
    BOOTSTRAP,
    BOOTSTRAP_NAME,
    PACKAGE_NAME,
    CodePackage,
    build_package,
)
from launcher.providers.sagemaker.provider import (
    CAPACITY_PATTERNS,
    ENTRY_SHELL,
    SageMakerProvider,
    SageMakerRequest,
)
from launcher.providers.sagemaker.settings import (
    JOB_NAME,
    SageMakerSettings,
    job_name,
    parse_timeout,
    status_of,
)

__all__ = [
    "BOOTSTRAP", "BOOTSTRAP_NAME", "CAPACITY_PATTERNS", "ENTRY_SHELL", "FILTER_PATTERN_MAX",
    "JOB_NAME", "LOG_GROUP", "PACKAGE_NAME", "CodePackage", "SageMakerProvider",
    "SageMakerRequest", "SageMakerSettings", "build_package", "event_filter", "job_name",
    "parse_timeout", "status_of",
]
