"""What a cloud job's code package holds: the one rule both cloud providers pack by.

The Vertex AI and SageMaker providers upload the recipe's folder (the ``code_dir``) to every node.
:func:`select` decides, once for both, which of its files go; the providers only pack what it
returns (``launch plan --provider vertex|sagemaker --json`` prints the decision as
``request.upload``). docs/packaging.md is the user-facing version of this docstring.

Selected: every regular file under the folder, except

- version control folders (``.git``, ``.hg``, ``.svn`` ...), caches (``__pycache__``,
  ``.pytest_cache``, ``node_modules``, ``*.egg-info`` ...), virtualenvs (``.venv``, ``venv``, any
  folder holding ``pyvenv.cfg`` or ``conda-meta/``), the launcher's state (``.launch``, and
  ``$LAUNCH_STATE_DIR`` wherever it lies in the folder), and compiled Python (``*.pyc``, ``*.pyo``);
- every hidden file and hidden folder (a name starting with ``.``: ``.env``, ``.aws/``, ``.ssh/``,
  ``.netrc``, ``.gitignore`` itself ...);
- files and folders whose name says "credentials" (:data:`CREDENTIAL_PATTERNS`, gitignore
  patterns matched case-insensitively: ``credentials``, ``*credentials*.json``,
  ``service-account*.json``, ``id_rsa*``, ``*.pem``, ``*.key``, ``*.tfstate`` ...);
- whatever ``GOOGLE_APPLICATION_CREDENTIALS``, ``AWS_SHARED_CREDENTIALS_FILE``, ``AWS_CONFIG_FILE``
  and the other variables of :data:`CREDENTIAL_VARIABLES` name, when it lies inside the folder;
- what ``.gitignore`` and ``.launchignore`` files in the folder (and its subfolders) exclude, with
  git's semantics (``!pattern`` re-includes; a deeper file overrides a shallower one;
  ``.launchignore`` overrides ``.gitignore`` in the same folder). They cannot re-include anything
  the rules above exclude;
- symlinks, unless both the link and its resolved target are inside the folder and the target is
  itself a selected file (then the link is packed as a copy of the target). A link whose target
  lies outside the folder is skipped, whatever it points to; folder symlinks are never followed.

Every file selected is then read once: hashed (the archive's name comes from it) and scanned, in
its first :data:`SCAN_LIMIT` bytes, for the shapes of live secrets (:data:`SECRET_SHAPES`: AWS
access key ids, private keys, Google Cloud service-account keys, GitHub, Slack, Hugging Face,
OpenAI and Google API tokens, wherever they are; AWS secret keys and session tokens, W&B API keys
and classic GitHub tokens where a literal of their shape is given to their name, however Python, a
notebook or a config gives it: :data:`GIVEN`). A file with more than one link is also scanned for
the shape of a credentials file (:func:`shapes_for`). One found is a refusal (:class:`SecretFound`,
exit 2, `launch plan` included) naming the file, the line and the kind of secret, before anything
is sent. More than :data:`MAX_UPLOAD_BYTES` selected is refused too: the folder is copied to every
node, and data belongs in the bucket.

Reading only: this runs inside the providers' dry runs, which must have no side effects.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.status import BadValue, UsageError

if TYPE_CHECKING:
    from launcher.providers.base import Job

#: The code folder is copied to every node; data and weights belong in the bucket.
MAX_UPLOAD_BYTES = 256 * 2**20
#: The files in the folder that exclude more of it, with gitignore semantics (the later wins).
IGNORE_FILES = (".gitignore", ".launchignore")
#: The launcher's own state folder (``LAUNCH_STATE_DIR`` defaults to it in the working folder).
STATE_DIR = ".launch"

VCS_DIRS = frozenset({".git", ".hg", ".svn", ".bzr", ".jj", "_darcs", "CVS"})
CACHE_DIRS = frozenset({
    "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis", ".tox", ".nox",
    ".ipynb_checkpoints", ".cache", "node_modules",
})
VENV_DIRS = frozenset({".venv", "venv"})
COMPILED_SUFFIXES = (".pyc", ".pyo")

#: Names of credential files, as gitignore patterns matched against the lower-cased path
#: relative to the folder (a pattern without ``/`` matches a name at any depth).
CREDENTIAL_PATTERNS: tuple[str, ...] = (
    # cloud credentials: AWS, Google Cloud, Kubernetes, Docker, Terraform state
    "credentials", "credentials.db", "credentials.y*ml", "credentials.toml", "credentials.ini",
    "credentials.cfg", "credentials.conf", "credentials.txt", "*credentials*.json",
    "*credentials*.csv", "*accesskeys*.csv",
    "*service-account*.json", "*service_account*.json", "*serviceaccount*.json",
    "client_secret*.json", "access_tokens.db", "**/aws/config", "**/docker/config.json",
    "**/kube/config", "kubeconfig", "*.kubeconfig", ".dockercfg",
    "*.tfstate", "*.tfstate.*", "*.tfvars",
    # environment files
    "*.env", ".env.*", ".env",
    # keys and certificates with their private half
    "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*", "*.pem", "*.key", "*.p12", "*.pfx",
    "*.jks", "*.keystore", "*.ppk",
    # tokens of package indexes, git and HTTP clients
    ".netrc", "_netrc", ".pypirc", ".npmrc", ".git-credentials", ".htpasswd",
    # secrets files by name
    "secrets.json", "secrets.toml", "secrets.yaml", "secrets.yml",
)
#: Variables that name a credentials file (or folder); what they name is never uploaded.
#: ``KUBECONFIG`` may list several, separated by ``os.pathsep``.
CREDENTIAL_VARIABLES = (
    "GOOGLE_APPLICATION_CREDENTIALS", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE", "CLOUDSDK_CONFIG", "KUBECONFIG", "DOCKER_CONFIG",
)

# -- the secret scan ---------------------------------------------------------------------------


_WORD = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


@dataclass(frozen=True)
class SecretShape:
    """One kind of secret: expressions that each start with a literal (so that the regular
    expression engine's fast literal search skips the bytes between candidates), whether a match
    may follow a letter, digit, ``_`` or ``-`` (``bounded`` says it may not), whether they are
    searched in the lower-cased bytes, and an expression that must match the same bytes too.
    Each expression is one pass over the bytes, whatever its alternatives after the first
    literal: kinds that start alike share one (``A[KS]IA``, ``g(?:h|ithub)``)."""

    kind: str
    patterns: tuple[re.Pattern[bytes], ...]
    bounded: bool = True
    lower: bool = False
    also: re.Pattern[bytes] | None = None

    def search(self, data: bytes, lowered: bytes | None = None) -> int | None:
        """Where the first match starts, or None (``lowered``: ``data.lower()``, if at hand)."""
        text = (data.lower() if lowered is None else lowered) if self.lower else data
        first = None
        for pattern in self.patterns:
            for match in pattern.finditer(text):
                start = match.start()
                if self.bounded and start and text[start - 1] in _WORD:
                    continue
                first = start if first is None else min(first, start)
                break
        if first is not None and self.also is not None and self.also.search(text) is None:
            return None
        return first


def _shape(kind: str, *patterns: bytes, **options: Any) -> SecretShape:
    return SecretShape(kind, tuple(re.compile(p) for p in patterns), **options)


#: How code and configs give a value to a name, in lower-cased bytes, between the name and the
#: value: ``NAME = value``, ``NAME: value``, ``"NAME": "value"``, ``update(NAME="value")``,
#: ``environ["NAME"] = "value"``, ``setdefault("NAME", "value")``, ``putenv("NAME", "value")``.
#: A quote may be escaped (``\"``), as it is in a notebook's JSON source lines; after ``]`` or
#: ``,`` the value must be quoted (a literal, not a variable or an argument).
GIVEN = (rb"""(?:(?:\\?["'])?\s*[:=]\s*(?:\\?["'])?"""
         rb"""|\\?["']\s*(?:\]\s*=|,)\s*\\?["'])""")


def _named(kind: str, names: tuple[bytes, ...], value: bytes) -> SecretShape:
    """A secret known by the name it is given: one expression per name, each the name (starting
    with a literal), :data:`GIVEN`, and a value of the secret's own shape. The shape is what
    tells a live value from a mention: a read (``environ["NAME"]``), another variable, ``""``,
    ``xxx``, ``<your key>``, ``${NAME}`` or ``changeme`` is not of it."""
    return _shape(kind, *(name + GIVEN + b"(?:" + value + b")" for name in names), lower=True)


#: The shapes of live secrets; the expressions are written so that this file matches none.
SECRET_SHAPES: tuple[SecretShape, ...] = (
    _shape("a Google Cloud service-account key", rb'"private_key"\s*:', bounded=False,
           also=re.compile(rb'"type"\s*:\s*"service_account"')),
    _shape("a private key", rb"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----",
           bounded=False),
    _shape("an AWS access key id", rb"A[KS]IA[A-Z0-9]{16}(?![A-Za-z0-9])"),
    _named("an AWS secret access key", (rb"aws_?secret_?access_?key",),
           rb"[a-z0-9/+]{40}(?![a-z0-9/+])"),
    _named("an AWS session token", (rb"aws_?se(?:ssion|curity)_?token",), rb"[a-z0-9/+]{100}"),
    _named("a Weights & Biases API key", (rb"wandb_?api_?key",),
           rb"(?:[a-z0-9_]{1,40}-)?[0-9a-f]{40}(?![a-z0-9_-])|wandb_v1_[a-z0-9_]{20}"),
    _named("a GitHub token", (rb"g(?:ithub|h)_?token",), rb"[0-9a-f]{40}(?![a-z0-9_-])"),
    _shape("a GitHub token",
           rb"g(?:h[pousr]_[A-Za-z0-9]{36}(?![A-Za-z0-9_])|ithub_pat_[A-Za-z0-9_]{22,})"),
    _shape("a Slack token", rb"xox[abposr]-[A-Za-z0-9]{4,}-[A-Za-z0-9-]{6,}"),
    _shape("a Hugging Face token", rb"hf_[A-Za-z]{34}(?![A-Za-z0-9_])"),
    _shape("an OpenAI API key", rb"sk-[A-Za-z0-9_-]{16,160}T3BlbkFJ[A-Za-z0-9_-]{16,}"),
    _shape("a Google API key", rb"AIza[0-9A-Za-z_-]{35}(?![A-Za-z0-9_-])"),
)
#: The shapes of the credentials files the cloud tools write: an AWS profile with its secret key
#: (``[default]`` and ``aws_secret_access_key``), a Google Cloud service-account key or
#: application-default login (``"private_key"`` or ``"refresh_token"``, with the client's
#: ``"client_email"`` or ``"client_secret"``). Looked for in files with more than one link only
#: (:func:`shapes_for`).
CREDENTIAL_FILE_SHAPES: tuple[SecretShape, ...] = (
    _shape("a hard link to an AWS credentials file", rb"aws_?secret_?access_?key[ \t]*=",
           lower=True, also=re.compile(rb"(?m)^[ \t]*\[[^\]\n]+\]")),
    _shape("a hard link to a Google Cloud credentials file",
           rb'"private_key"\s*:', rb'"refresh_token"\s*:', bounded=False,
           also=re.compile(rb'"client_(?:email|secret)"\s*:')),
)
#: Files are read in blocks of this size; consecutive blocks are scanned with this much overlap,
#: so a secret that straddles two blocks is still whole in one window.
READ_BLOCK = 1 << 20
SCAN_OVERLAP = 4096
#: Each file is scanned in its first 8 MiB (all of it, for code and configs): a bigger file is
#: data, and this keeps a full 256 MiB folder's scan within a few seconds (the whole file is
#: still hashed).
SCAN_LIMIT = 8 * 2**20


@dataclass(frozen=True)
class Finding:
    """A secret shape found in a file that would be uploaded."""

    name: str   # the file, relative to the folder
    line: int
    kind: str

    def __str__(self) -> str:
        return f"{self.name}:{self.line}: {self.kind}"


class SecretFound(BadValue):
    """A file that would be uploaded holds what looks like a live secret (exit 2).

    A :class:`BadValue`, not a plain UsageError: like a malformed region, it stops every command,
    `launch plan` included (a missing bucket or role only costs `plan` its request)."""

    def __init__(self, findings: list[Finding]):
        first = findings[0]
        more = sorted({f.name for f in findings[1:]} - {first.name})
        message = (f"refusing to upload {first.name}: line {first.line} looks like {first.kind}"
                   + (f" (and {len(more)} more file(s): {', '.join(more[:3])}"
                      f"{', ...' if len(more) > 3 else ''})" if more else ""))
        super().__init__(message, "remove the secret from the code folder (the job gets its "
                                  "credentials from its service account or role), or list the "
                                  "file in .launchignore if the job does not need it")
        self.findings = findings


def shapes_for(links: int) -> tuple[SecretShape, ...]:
    """What a file with ``links`` links (its ``st_nlink``) is scanned for: :data:`SECRET_SHAPES`,
    and :data:`CREDENTIAL_FILE_SHAPES` too when it has more than one.

    A hard link is the file itself under another name, indistinguishable from its target: unlike
    a symlink it has no target path to check against the folder, so a hard link to
    ``~/.aws/credentials`` named ``notes.txt`` passes every rule that goes by names and paths.
    Its link count is the one trace it leaves, so a file with more than one link is refused when
    it has a credentials file's shape, even one holding no secret shape (the keys of an
    S3-compatible store, gcloud's application-default login). A file with one link is not:
    a credentials file's shape alone (an example in the docs, a test's fixture) is no secret.
    The name half needs nothing more: a file named like a credentials file
    (:data:`CREDENTIAL_PATTERNS`) is left out whatever its link count."""
    return SECRET_SHAPES + CREDENTIAL_FILE_SHAPES if links > 1 else SECRET_SHAPES


def scan_bytes(data: bytes, line_offset: int = 0,
               shapes: tuple[SecretShape, ...] = SECRET_SHAPES) -> tuple[int, str] | None:
    """The first of ``shapes`` in ``data``: (1-based line, kind), or None."""
    lowered = None   # lower-cased once, for every shape that searches it
    for shape in shapes:
        if shape.lower and lowered is None:
            lowered = data.lower()
        start = shape.search(data, lowered)
        if start is not None:
            return line_offset + data.count(b"\n", 0, start) + 1, shape.kind
    return None


def _hash_and_scan(path: Path, shapes: tuple[SecretShape, ...] = SECRET_SHAPES,
                   ) -> tuple[str, int, tuple[int, str] | None]:
    """Read ``path`` once: its SHA-256, its size, and the first of ``shapes`` in it."""
    digest = hashlib.sha256()
    size = 0
    finding = None
    tail = b""          # the end of the previous block, scanned again with the next
    lines_before = 0    # newlines before ``tail``
    with open(path, "rb") as handle:
        while block := handle.read(READ_BLOCK):
            digest.update(block)
            scanning = finding is None and size < SCAN_LIMIT
            size += len(block)
            if scanning:
                window = tail + block
                finding = scan_bytes(window, lines_before, shapes)
                tail = window[-SCAN_OVERLAP:]
                lines_before += window.count(b"\n") - tail.count(b"\n")
    return digest.hexdigest(), size, finding


# -- the selection -----------------------------------------------------------------------------


@dataclass(frozen=True)
class SelectedFile:
    """A file that will be uploaded: its name in the package and where its bytes come from."""

    name: str          # relative to the folder, with ``/``
    path: Path         # on disk (a kept symlink's target)
    size: int
    executable: bool
    sha256: str        # of the bytes that were scanned

    def read(self) -> bytes:
        """The bytes, which must still be those scanned and hashed."""
        data = self.path.read_bytes()
        if hashlib.sha256(data).hexdigest() != self.sha256:
            raise UsageError(f"{self.path} changed while the job was being packed",
                             "run the launch again")
        return data


@dataclass(frozen=True)
class Skipped:
    path: str    # relative to the folder; a folder ends with "/"
    reason: str


@dataclass(frozen=True)
class Selection:
    """What :func:`select` decided: the files uploaded, and what was left out and why."""

    root: Path
    files: tuple[SelectedFile, ...]
    skipped: tuple[Skipped, ...] = field(default=())

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        return {"root": str(self.root),
                "files": [{"name": f.name, "bytes": f.size, "executable": f.executable}
                          for f in self.files],
                "bytes": self.size,
                "skipped": [{"path": s.path, "reason": s.reason} for s in self.skipped]}


@functools.cache
def _credential_spec() -> Any:
    import pathspec

    return pathspec.GitIgnoreSpec.from_lines(CREDENTIAL_PATTERNS)


class _Rule:
    """The decision for one folder: :meth:`reason` says why a path is left out (or None)."""

    def __init__(self, root: Path, environ: Mapping[str, str], skip: Iterable[Path]):
        self.root = root
        self.named: dict[str, str] = {}   # relative path -> the variable naming it
        for variable in CREDENTIAL_VARIABLES:
            for value in (environ.get(variable) or "").split(os.pathsep):
                if value.strip():
                    for candidate in _inside(root, Path(value.strip()).expanduser()):
                        self.named.setdefault(candidate, variable)
        self.state = {rel for path in skip for rel in _inside(root, Path(path))}
        self._ignores: dict[str, list[tuple[str, Any]]] = {}

    def reason(self, rel: str, is_dir: bool) -> str | None:
        """Why ``rel`` (a path relative to the root) is left out, ``None`` when it is not.

        Only this path's own name and the ignore files are looked at; its parent folders are
        the walk's business (:meth:`path_reason` checks them too)."""
        name = rel.rsplit("/", 1)[-1]
        if rel in self.named:
            return f"named by {self.named[rel]}"
        if is_dir and rel in self.state:
            return "launcher state"
        pattern = self._credential(rel, is_dir)
        if pattern is not None:
            return f"credential file name ({pattern})"
        if is_dir:
            if name in VCS_DIRS:
                return "version control"
            if name == STATE_DIR:
                return "launcher state"
            path = self.root / rel
            if name in VENV_DIRS or (path / "pyvenv.cfg").exists() or (
                    path / "conda-meta").is_dir():
                return "virtualenv"
            if name in CACHE_DIRS or name.endswith(".egg-info"):
                return "cache"
        if name.startswith("."):
            return "hidden"
        if not is_dir and name.endswith(COMPILED_SUFFIXES):
            return "compiled Python"
        return self._ignored(rel, is_dir)

    def path_reason(self, rel: str) -> str | None:
        """Why the file ``rel`` is left out, its parent folders included."""
        parts = rel.split("/")
        for depth in range(1, len(parts)):
            folder = "/".join(parts[:depth])
            why = self.reason(folder, is_dir=True)
            if why is not None:
                return f"in {folder}/: {why}"
        return self.reason(rel, is_dir=False)

    def _credential(self, rel: str, is_dir: bool) -> str | None:
        result = _credential_spec().check_file(rel.lower() + ("/" if is_dir else ""))
        return CREDENTIAL_PATTERNS[result.index] if result.include else None

    def _ignored(self, rel: str, is_dir: bool) -> str | None:
        """Git's precedence: the deepest folder whose ignore files have a say decides; in it,
        ``.launchignore`` before ``.gitignore``, and within a file the last pattern that
        matches (a ``!pattern`` re-includes)."""
        parts = rel.split("/")
        for depth in range(len(parts) - 1, -1, -1):
            base = "/".join(parts[:depth])
            sub = "/".join(parts[depth:]) + ("/" if is_dir else "")
            for source, spec in self._ignore_specs(base):
                include = spec.check_file(sub).include
                if include is None:
                    continue
                return f"listed in {base + '/' if base else ''}{source}" if include else None
        return None

    def _ignore_specs(self, base: str) -> list[tuple[str, Any]]:
        """The ignore files of the folder ``base``, the one that wins first."""
        if base not in self._ignores:
            import pathspec

            specs = []
            for ignore_file in reversed(IGNORE_FILES):
                try:
                    text = (self.root / base / ignore_file).read_text(encoding="utf-8",
                                                                       errors="replace")
                except OSError:
                    continue
                specs.append((ignore_file, pathspec.GitIgnoreSpec.from_lines(
                    [line for line in text.splitlines() if _valid_pattern(line)])))
            self._ignores[base] = specs
        return self._ignores[base]


def _valid_pattern(line: str) -> bool:
    """Whether ``line`` compiles as a gitignore pattern; git skips one that does not (a lone
    ``!``, a trailing backslash), and so does the launcher."""
    import pathspec

    try:
        pathspec.GitIgnoreSpec.from_lines([line]).check_file("x")
    except Exception:  # pathspec's own error, or re.error from a bad range like [z-a]
        return False
    return True


def _inside(root: Path, path: Path) -> list[str]:
    """``path`` relative to ``root`` (as written, and resolved), for each that lies inside."""
    found = []
    absolute = Path(os.path.abspath(path))
    for candidate in (absolute, Path(os.path.realpath(absolute))):
        try:
            rel = candidate.relative_to(root).as_posix()
        except ValueError:
            continue
        if rel != "." and rel not in found:
            found.append(rel)
    return found


def select(code_dir: Path, *, environ: Mapping[str, str] | None = None,
           skip: Iterable[Path] = (), require: Iterable[Path] = (),
           data_hint: str = "the bucket") -> Selection:
    """The files of ``code_dir`` a cloud job gets, per the rule of this module's docstring.

    ``environ``: where the credential variables are read (the launcher's environment by
    default). ``skip``: more folders to leave out (the launcher's state folder, where it lies
    inside). ``require``: files inside the folder the job cannot run without (the script); one
    the rule leaves out is a UsageError saying why. ``data_hint``: where data belongs, for the
    too-big message. Raises :class:`SecretFound` when a selected file holds a secret shape,
    UsageError when the selection is too big.
    """
    environ = os.environ if environ is None else environ
    root = Path(os.path.realpath(code_dir))
    if not root.is_dir():
        raise UsageError(f"the code folder {code_dir} is not a folder")
    rule = _Rule(root, environ, skip)
    chosen: list[tuple[str, Path, int, bool]] = []   # name, path, size, executable
    links: dict[str, int] = {}                        # name -> the file's link count
    skipped: list[Skipped] = []

    def visit(folder: Path, rel_folder: str) -> None:
        try:
            with os.scandir(folder) as scan:
                entries = sorted(scan, key=lambda e: e.name)
        except OSError as exc:
            skipped.append(Skipped(rel_folder + "/", f"unreadable ({exc.strerror})"))
            return
        for entry in entries:
            rel = f"{rel_folder}/{entry.name}" if rel_folder else entry.name
            try:
                if entry.is_symlink():
                    _link(entry, rel)
                elif entry.is_dir(follow_symlinks=False):
                    why = rule.reason(rel, is_dir=True)
                    if why is None:
                        visit(Path(entry.path), rel)
                    else:
                        skipped.append(Skipped(rel + "/", why))
                elif entry.is_file(follow_symlinks=False):
                    why = rule.reason(rel, is_dir=False)
                    if why is None:
                        info = entry.stat(follow_symlinks=False)
                        chosen.append((rel, Path(entry.path), info.st_size,
                                       bool(info.st_mode & stat.S_IXUSR)))
                        links[rel] = info.st_nlink
                    else:
                        skipped.append(Skipped(rel, why))
                else:
                    skipped.append(Skipped(rel, "not a regular file"))
            except OSError as exc:
                skipped.append(Skipped(rel, f"unreadable ({exc.strerror})"))

    def _link(entry: os.DirEntry[str], rel: str) -> None:
        target = Path(os.path.realpath(entry.path))
        try:
            target_rel = target.relative_to(root).as_posix()
        except ValueError:
            skipped.append(Skipped(rel, f"symlink to outside the folder ({target})"))
            return
        if not target.exists():
            skipped.append(Skipped(rel, "dangling symlink"))
        elif target.is_dir():
            skipped.append(Skipped(rel + "/", "symlink to a folder (not followed)"))
        elif not target.is_file():
            skipped.append(Skipped(rel, "not a regular file"))
        elif (why := rule.reason(rel, is_dir=False)) is not None:
            skipped.append(Skipped(rel, why))
        elif (why := rule.path_reason(target_rel)) is not None:
            skipped.append(Skipped(rel, f"symlink to a file left out ({target_rel}: {why})"))
        else:
            info = target.stat()
            chosen.append((rel, target, info.st_size, bool(info.st_mode & stat.S_IXUSR)))
            links[rel] = info.st_nlink

    visit(root, "")
    names = {name for name, _path, _size, _x in chosen}
    for required in require:
        for rel in _inside(root, Path(required))[:1]:
            if rel not in names:
                why = next((s.reason for s in skipped
                            if s.path == rel or rel.startswith(s.path.rstrip("/") + "/")),
                           "not found")
                raise UsageError(f"the script {rel} is left out of the upload ({why})",
                                 "rename or move it (docs/packaging.md says what is uploaded)")
    total = sum(size for _name, _path, size, _x in chosen)
    if total > MAX_UPLOAD_BYTES:
        name, _path, size, _x = max(chosen, key=lambda c: c[2])
        raise UsageError(
            f"the code folder {code_dir} holds {total / 2**20:.0f} MiB to upload (largest: {name}, "
            f"{size / 2**20:.0f} MiB), more than {MAX_UPLOAD_BYTES >> 20} MiB; it is copied to "
            "every node",
            f"keep data and weights in {data_hint}, list them in .launchignore, or move the "
            "script into a folder of its own")
    files: list[SelectedFile] = []
    findings: list[Finding] = []
    for name, path, _size, executable in chosen:
        try:
            digest, size, found = _hash_and_scan(path, shapes_for(links[name]))
        except OSError as exc:
            skipped.append(Skipped(name, f"unreadable ({exc.strerror})"))
            continue
        if found is not None:
            findings.append(Finding(name, *found))
        files.append(SelectedFile(name=name, path=path, size=size, executable=executable,
                                  sha256=digest))
    if findings:
        raise SecretFound(findings)
    return Selection(root=root, files=tuple(files),
                     skipped=tuple(sorted(skipped, key=lambda s: s.path)))


def select_for_job(job: Job, environ: Mapping[str, str] | None = None,
                   data_hint: str = "the bucket") -> Selection:
    """:func:`select` for a job: its code folder, without the launcher's state folder, with the
    scripts it runs required."""
    return select(job.code_dir, environ=environ, skip=(state_root(job.attempt_dir),),
                  require=scripts_of(job), data_hint=data_hint)


def state_root(attempt_dir: Path) -> Path:
    """The launcher's state folder of an attempt (``<state>/runs/<run>/attempt-<n>``)."""
    real = Path(os.path.realpath(attempt_dir))
    return real.parents[2] if len(real.parents) > 2 else real


def scripts_of(job: Job) -> tuple[Path, ...]:
    """The user's files a job runs: a plain script, or the recipe the rendered script loads."""
    paths = []
    rendered = job.rendered
    if rendered.entrypoint not in rendered.files:
        paths.append(rendered.entrypoint)
    try:
        recipe = json.loads(rendered.files.get("plan.json") or "{}").get("recipe_file")
    except (ValueError, AttributeError):
        recipe = None
    if recipe:
        paths.append(recipe)
    return tuple(Path(p) if Path(p).is_absolute() else job.code_dir / p for p in paths)
