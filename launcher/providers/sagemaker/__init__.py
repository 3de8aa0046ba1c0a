"""The SageMaker provider, everything about AWS in one package.

``provider.py`` (:class:`SageMakerProvider`: the request, sending, following, stopping),
``logs.py`` (reading CloudWatch Logs: every stream of a job and the event channel),
``settings.py`` (the run's settings, job names and states), ``package.py`` (the code package),
``doctor.py`` (`launch doctor --provider sagemaker`), ``bootstrap.py`` (``launch_sagemaker.py``,
what starts torchrun on every host, shipped as package data), ``sdk.py`` (the training image
URIs, from sagemaker-core) and ``_aws.py`` (how one talks to AWS). Importing it imports no AWS
SDK: boto3 is imported by the calls that need it, sagemaker-core by the dry run alone.

Its ``__init__`` imports only the settings (`launch --help` reads them); the rest of the
names below are imported from their modules on first use.
"""

from __future__ import annotations

from launcher.providers import lazy_names
from launcher.providers.sagemaker.settings import SageMakerSettings

#: This package's module -> the names imported from it on first use.
__getattr__ = lazy_names(__name__, {
    "logs": ("FILTER_PATTERN_MAX", "LOG_GROUP", "event_filter"),
    "package": ("BOOTSTRAP", "BOOTSTRAP_NAME", "PACKAGE_NAME", "CodePackage", "build_package"),
    "provider": ("CAPACITY_PATTERNS", "ENTRY_SHELL", "SageMakerProvider", "SageMakerRequest"),
    "settings": ("JOB_NAME", "job_name", "parse_timeout", "status_of"),
})

__all__ = ["BOOTSTRAP", "BOOTSTRAP_NAME", "CAPACITY_PATTERNS", "CodePackage", "ENTRY_SHELL",
    "FILTER_PATTERN_MAX", "JOB_NAME", "LOG_GROUP", "PACKAGE_NAME", "SageMakerProvider",
    "SageMakerRequest", "SageMakerSettings", "build_package", "event_filter", "job_name",
    "parse_timeout", "status_of"]
