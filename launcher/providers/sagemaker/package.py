"""The code package of a SageMaker job: ``sourcedir.tar.gz``, uploaded as the ``code`` channel."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any

from launcher import packaging
from launcher.packaging import Selection
from launcher.providers.base import Job, in_code_folder
from launcher.status import UsageError

OPT_ML = "/opt/ml"
CODE_CHANNEL = "code"
PACKAGE_NAME = "sourcedir.tar.gz"
CODE_ARCHIVE = f"{OPT_ML}/input/data/{CODE_CHANNEL}/{PACKAGE_NAME}"
CODE_DIR = f"{OPT_ML}/code"
RESOURCE_CONFIG = f"{OPT_ML}/input/config/resourceconfig.json"
CHECKPOINT_LOCAL = f"{OPT_ML}/checkpoints"
#: SageMaker shows this file's text as the job's FailureReason: the training script writes its
#: out-of-memory report there (LAUNCH_FAILURE_FILE), the first rank to fail.
FAILURE_FILE = f"{OPT_ML}/output/failure"
BOOTSTRAP_NAME = "launch_sagemaker.py"
#: ``launch_sagemaker.py``: reads SageMaker's resourceconfig.json and execs torchrun with this
#: host's node rank (``bootstrap.py`` of this package, shipped as package data).
BOOTSTRAP = resources.files(__package__).joinpath("bootstrap.py").read_text(encoding="utf-8")
#: Fixed modification time of every packed file, so equal content gives an equal archive hash.
PACKAGE_MTIME = 946684800  # 2000-01-01T00:00:00Z


@dataclass(frozen=True)
class CodePackage:
    """``sourcedir.tar.gz``: the recipe's folder, the rendered files and the bootstrap.

    Built in memory by the dry run (reading files only) so that the hash, and with it the S3 key,
    is part of the request; ``schedule`` uploads these very bytes.
    """

    bucket: str
    key: str
    sha256: str
    size_bytes: int
    files: tuple[str, ...]
    entrypoint: str                 # relative to the unpacked folder
    replaced: tuple[str, ...] = ()  # user files with the name of a rendered one (ours win)
    data: bytes = field(default=b"", repr=False, compare=False)
    upload: Selection | None = field(default=None, repr=False, compare=False)  # the code folder
    #: The S3 URI it was uploaded instead of, an object launch did not write holding that key
    #: (see ``SageMakerProvider._upload``); "" when at its own key.
    instead_of: str = ""

    @property
    def s3_uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    @property
    def channel_uri(self) -> str:
        """The folder holding only this archive: the ``code`` channel's S3 prefix."""
        return f"s3://{self.bucket}/{self.key.rsplit('/', 1)[0]}/"

    @property
    def sha256_base64(self) -> str:
        """The SHA-256 as S3 gives it (``ChecksumSHA256``)."""
        return base64.b64encode(bytes.fromhex(self.sha256)).decode("ascii")

    def elsewhere(self, token: str) -> CodePackage:
        """The same package under a folder of its own beside its usual one
        (``code/<hash>-<token>/``): not under it, which is the usual key's channel prefix."""
        folder, name = self.key.rsplit("/", 1)
        return replace(self, key=f"{folder}-{token}/{name}", instead_of=self.s3_uri)

    def to_dict(self) -> dict[str, Any]:
        data = {"s3_uri": self.s3_uri, "sha256": self.sha256, "size_bytes": self.size_bytes,
                "entrypoint": self.entrypoint, "files": list(self.files),
                "replaced": list(self.replaced)}
        if self.instead_of:
            data["instead_of"] = self.instead_of
        return data


def _tar(entries: dict[str, tuple[bytes, int]]) -> bytes:
    """A tar.gz whose bytes depend on names, contents and modes only (sorted, fixed times and
    owners, gzip without a timestamp)."""
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=6) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(entries):
            data, mode = entries[name]
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode
            info.mtime = PACKAGE_MTIME
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def build_package(job: Job, bucket: str, prefix: str,
                  environ: Mapping[str, str] | None = None) -> CodePackage:
    """Pack the job's code; see :class:`CodePackage`. Which files of the code folder go is
    :func:`launcher.packaging.select`'s decision (shared with Vertex AI).

    ``plan.json`` is rewritten for the container: the recipe path relative to the unpacked folder
    and the checkpoint folder that SageMaker syncs (the rendered one names local paths).
    """
    code_dir = job.code_dir
    upload = packaging.select_for_job(job, environ, "S3 (read it in build_dataloader)")
    entries: dict[str, tuple[bytes, int]] = {
        f.name: (f.read(), 0o755 if f.executable else 0o644) for f in upload.files}
    rendered = job.rendered
    replaced = tuple(sorted(n for n in (*rendered.files, BOOTSTRAP_NAME) if n in entries))
    for name, text in rendered.files.items():
        if name == "plan.json":
            text = _container_plan(text, code_dir)
        entries[PurePosixPath(name).as_posix()] = (text.encode("utf-8"), 0o644)
    entries[BOOTSTRAP_NAME] = (BOOTSTRAP.encode("utf-8"), 0o755)
    entry = rendered.entrypoint
    entrypoint = entry if entry in rendered.files else in_code_folder(entry, code_dir)
    if entrypoint not in entries:
        raise UsageError(f"the script {entrypoint} is not in the package of {code_dir}",
                         "the packaging rule leaves it out (docs/packaging.md); rename or move "
                         "it")
    data = _tar(entries)
    digest = hashlib.sha256(data).hexdigest()
    key = "/".join(p for p in (prefix, "code", digest[:24], PACKAGE_NAME) if p)
    return CodePackage(bucket=bucket, key=key, sha256=digest, size_bytes=len(data),
                       files=tuple(sorted(entries)), entrypoint=entrypoint, replaced=replaced,
                       data=data, upload=upload)


def _container_plan(text: str, code_dir: Path) -> str:
    document = json.loads(text)
    if document.get("recipe_file"):
        document["recipe_file"] = in_code_folder(document["recipe_file"], code_dir, "recipe")
    document["checkpoint_dir"] = CHECKPOINT_LOCAL
    return json.dumps(document, indent=2) + "\n"

