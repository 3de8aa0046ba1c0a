"""launcher/packaging.py: the one rule for what a cloud job's code package holds.

The providers' own tests (tests/providers/test_vertex.py, test_sagemaker.py) open the archives
built from this rule; here are the rule's parts: names, ignore files, links, variables, the
secret scan and the size cap. Secrets are assembled at run time, so this file holds none.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from launcher import packaging
from launcher.packaging import SecretFound, select
from launcher.status import ExitStatus, UsageError

#: Shapes of live secrets, built here so that no scanner flags this file.
AWS_KEY_ID = "AKIA" + "Q7ZD4W2LXNB5" + "TRUE"
AWS_SECRET = "wJalr" + "XUtnFEMI/K7MDENG/bPxRfiCY" + "4TRUEKEY1x"
PEM = "-----BEGIN " + "RSA PRIVATE KEY-----\nMIIEow...\n-----END " + "RSA PRIVATE KEY-----\n"
GITHUB = "ghp" + "_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
SLACK = "xox" + "b-1234567890-abcdefghijkl"
HUGGING_FACE = "hf" + "_" + "QwErTyUiOpAsDfGhJkLzXcVbNmQwErTyUi"
GOOGLE_API = "AI" + "za" + "SyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q"
SERVICE_ACCOUNT = json.dumps({"type": "service" + "_account", "project_id": "p",
                              "private" + "_key": "-----BEGIN " + "PRIVATE KEY-----\\n...",
                              "client_email": "a@p.iam.gserviceaccount.com"})
OPENAI = "sk-proj-" + "x1" * 12 + "T3Blbk" + "FJ" + "y2" * 12
#: Secrets known by the name they are given to, not by a shape of their own.
AWS_SESSION = "IQoJb3JpZ2luX2Vj" + "EJr//////////wEaCXVzLWVhc3QtMSJHMEUCIQD" * 4
WANDB = "9f3c" + "0a1b2c3d4e" * 3 + "5f6a7b"
GITHUB_CLASSIC = "e72e" + "16c7e42f29" * 3 + "2c6912"
#: Credentials files that hold no secret shape: a profile for an S3-compatible store (Cloudflare
#: R2: 32- and 64-character keys), and gcloud's application-default login.
AWS_PROFILE = ("[r2]\nregion = auto\naws_access_key_id = " + "3f9a" * 8
               + "\naws_secret_access_key = " + "7d1e" * 16 + "\n")
USER_ADC = json.dumps({"client_id": "1234567890-abc.apps.googleusercontent.com",
                       "client_secret": "GOCSPX" + "-q1W2e3R4t5Y6u7I8o9P0a1S2d3F4",
                       "refresh" + "_token": "1//0g" + "Xy7-" * 20,
                       "type": "authorized" + "_user"}, indent=2)


def write(root: Path, name: str, text: str = "x\n", mode: int | None = None) -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mode is not None:
        path.chmod(mode)
    return path


@pytest.fixture
def code(tmp_path: Path) -> Path:
    root = tmp_path / "code"
    write(root, "train.py", "print('train')\n")
    return root


def skipped(selection: packaging.Selection) -> dict[str, str]:
    return {s.path: s.reason for s in selection.skipped}


# -- what is left out by name --------------------------------------------------------------------


def test_the_code_is_selected_and_credentials_caches_and_environments_are_not(code):
    write(code, "model/layers.py")
    write(code, "configs/base.yaml", "lr: 0.1\n")
    write(code, "run.sh", "#!/bin/sh\n", mode=0o755)
    write(code, "credentials.py", "def load(): ...\n")  # code about credentials is code
    leave_out = {
        ".env": "credential file name (.env)",
        "prod.env": "credential file name (*.env)",
        ".netrc": "credential file name (.netrc)",
        ".pypirc": "credential file name (.pypirc)",
        ".git-credentials": "credential file name (.git-credentials)",
        "service-account.json": "credential file name (*service-account*.json)",
        "my_service_account_key.json": "credential file name (*service_account*.json)",
        "gcloud/application_default_credentials.json":
            "credential file name (*credentials*.json)",
        "client_secret_1234.json": "credential file name (client_secret*.json)",
        "aws/credentials": "credential file name (credentials)",
        "deploy/CREDENTIALS": "credential file name (credentials)",
        "aws/config": "credential file name (**/aws/config)",
        "keys/id_rsa": "credential file name (id_rsa*)",
        "keys/id_ed25519.pub": "credential file name (id_ed25519*)",
        "tls/server.pem": "credential file name (*.pem)",
        "tls/server.key": "credential file name (*.key)",
        "cert.p12": "credential file name (*.p12)",
        "kubeconfig": "credential file name (kubeconfig)",
        "infra/terraform.tfstate": "credential file name (*.tfstate)",
        "notes.txt.swp": None,  # not a credential: selected
        "stale.pyc": "compiled Python",
        ".hidden_notes": "hidden",
    }
    for name in leave_out:
        write(code, name)
    for folder in (".git", ".aws", ".ssh", ".launch", "__pycache__", ".venv", "venv",
                   "node_modules", ".pytest_cache", "launcher.egg-info"):
        write(code, f"{folder}/inside")
    write(code, "myenv/pyvenv.cfg", "home = /usr/bin\n")
    write(code, "condaenv/conda-meta/history")

    selection = select(code, environ={})

    assert selection.names == ("configs/base.yaml", "credentials.py", "model/layers.py",
                               "notes.txt.swp", "run.sh", "train.py")
    reasons = skipped(selection)
    for name, reason in leave_out.items():
        if reason is not None:
            assert reasons[name] == reason, name
    assert reasons[".git/"] == "version control"
    assert reasons[".aws/"] == reasons[".ssh/"] == "hidden"
    assert reasons[".launch/"] == "launcher state"
    assert reasons["__pycache__/"] == reasons["node_modules/"] == "cache"
    assert reasons[".pytest_cache/"] == reasons["launcher.egg-info/"] == "cache"
    assert reasons[".venv/"] == reasons["venv/"] == "virtualenv"
    assert reasons["myenv/"] == reasons["condaenv/"] == "virtualenv"
    # A skipped folder is one entry, not one per file inside it.
    assert not any(path.startswith((".git/", ".venv/")) and path not in (".git/", ".venv/")
                   for path in reasons)
    run_sh = next(f for f in selection.files if f.name == "run.sh")
    assert run_sh.executable and not selection.files[-1].executable


def test_the_files_credential_variables_name_are_left_out_where_they_lie_in_the_folder(
        code, tmp_path):
    write(code, "keys/gcp.json", "{}")
    write(code, "aws-shared")
    write(code, "conf/aws-config")
    write(code, "kube/a.yaml")
    write(code, "kube/b.yaml")
    write(code, "gcloud-config/properties")
    outside = write(tmp_path, "elsewhere/creds.json")
    environ = {
        "GOOGLE_APPLICATION_CREDENTIALS": str(code / "keys" / "gcp.json"),
        "AWS_SHARED_CREDENTIALS_FILE": str(code / "aws-shared"),
        "AWS_CONFIG_FILE": str(code / "conf" / ".." / "conf" / "aws-config"),
        "KUBECONFIG": os.pathsep.join([str(code / "kube" / "a.yaml"), str(outside)]),
        "CLOUDSDK_CONFIG": str(code / "gcloud-config"),
    }
    selection = select(code, environ=environ)
    reasons = skipped(selection)
    assert reasons["keys/gcp.json"] == "named by GOOGLE_APPLICATION_CREDENTIALS"
    assert reasons["aws-shared"] == "named by AWS_SHARED_CREDENTIALS_FILE"
    assert reasons["conf/aws-config"] == "named by AWS_CONFIG_FILE"
    assert reasons["kube/a.yaml"] == "named by KUBECONFIG"
    assert reasons["gcloud-config/"] == "named by CLOUDSDK_CONFIG"
    assert selection.names == ("kube/b.yaml", "train.py")
    # Read from the environment given, not the launcher's own.
    assert "keys/gcp.json" in select(code, environ={}).names


def test_a_state_folder_inside_the_code_folder_is_left_out(code):
    write(code, "state/runs/r1/attempt-1/job/launch_train.py")
    selection = select(code, environ={}, skip=[code / "state"])
    assert selection.names == ("train.py",)
    assert skipped(selection) == {"state/": "launcher state"}
    assert packaging.state_root(code / "state" / "runs" / "r1" / "attempt-1") == code / "state"


def test_a_script_the_rule_leaves_out_is_named_with_the_reason(code, tmp_path):
    write(code, ".gitignore", "scratch_*.py\n")
    write(code, "scratch_1.py")
    write(code, "venv/run.py")
    with pytest.raises(UsageError) as caught:
        select(code, environ={}, require=[code / "train.py", code / "scratch_1.py"])
    assert caught.value.message == (
        "the script scratch_1.py is left out of the upload (listed in .gitignore)")
    with pytest.raises(UsageError, match=r"venv/run.py is left out of the upload \(virtualenv\)"):
        select(code, environ={}, require=[code / "venv" / "run.py"])
    # A script outside the folder is the providers' to refuse; here it changes nothing.
    assert select(code, environ={}, require=[tmp_path / "x.py"]).names == ("train.py",)


# -- .launchignore and .gitignore ----------------------------------------------------------------


def test_ignore_files_have_gitignore_semantics(code):
    write(code, ".gitignore", "# build output\ndata/\n*.ckpt\n!keep.ckpt\n/top.txt\nlogs\n")
    write(code, ".launchignore", "notebooks/\n!logs\nsub/big.bin\n")
    for name in ("data/train.csv", "a.ckpt", "keep.ckpt", "top.txt", "sub/top.txt", "logs",
                 "notebooks/explore.ipynb", "sub/big.bin", "sub/small.bin", "sub/deep/c.ckpt",
                 "sub/deep/d.ckpt", "sub/deep/e.txt"):
        write(code, name)
    # A deeper ignore file overrides a shallower one.
    write(code, "sub/deep/.gitignore", "!d.ckpt\ne.txt\n")

    selection = select(code, environ={})

    assert selection.names == ("keep.ckpt", "logs", "sub/deep/d.ckpt", "sub/small.bin",
                               "sub/top.txt", "train.py")
    reasons = skipped(selection)
    assert reasons["data/"] == "listed in .gitignore"
    assert reasons["a.ckpt"] == reasons["top.txt"] == "listed in .gitignore"
    assert reasons["sub/deep/c.ckpt"] == "listed in .gitignore"
    assert reasons["sub/deep/e.txt"] == "listed in sub/deep/.gitignore"
    assert reasons["notebooks/"] == reasons["sub/big.bin"] == "listed in .launchignore"
    assert reasons[".gitignore"] == reasons[".launchignore"] == "hidden"


def test_ignore_files_cannot_bring_back_what_the_rule_leaves_out(code):
    write(code, ".launchignore", "!.env\n!service-account.json\n!.aws/\n!__pycache__/\n")
    for name in (".env", "service-account.json", ".aws/credentials", "__pycache__/x.pyc"):
        write(code, name)
    assert select(code, environ={}).names == ("train.py",)


def test_lines_that_are_no_pattern_are_skipped_as_git_does(code):
    write(code, ".launchignore", "!\n[z-a]\ntrailing\\\ndata/\n")
    write(code, "data/a.csv")
    assert select(code, environ={}).names == ("train.py",)


# -- links ---------------------------------------------------------------------------------------


def test_links_out_of_the_folder_are_never_followed(code, tmp_path):
    home = tmp_path / "home"
    credentials = write(home, ".aws/credentials", f"aws_access_key_id = {AWS_KEY_ID}\n")
    write(home, "project/secret.txt", "secret")
    (code / "aws-creds").symlink_to(credentials)
    (code / "linked-project").symlink_to(home / "project", target_is_directory=True)
    (code / "model.py").write_text("WIDTH = 16\n")
    (code / "alias.py").symlink_to("model.py")         # inside, to a selected file: a copy
    (code / ".env").write_text("TOKEN=1\n")
    (code / "settings.txt").symlink_to(".env")         # inside, to a file left out
    write(code, "pkg/mod.py")
    (code / "pkg-link").symlink_to("pkg", target_is_directory=True)
    (code / "dangling.py").symlink_to("nothing-here.py")

    selection = select(code, environ={})  # no refusal: the key behind the link is never read

    assert selection.names == ("alias.py", "model.py", "pkg/mod.py", "train.py")
    alias = next(f for f in selection.files if f.name == "alias.py")
    assert alias.path == (code / "model.py").resolve() and alias.read() == b"WIDTH = 16\n"
    reasons = skipped(selection)
    assert reasons["aws-creds"] == f"symlink to outside the folder ({credentials})"
    assert reasons["linked-project"].startswith("symlink to outside the folder")
    assert reasons["settings.txt"] == (
        "symlink to a file left out (.env: credential file name (.env))")
    assert reasons["pkg-link/"] == "symlink to a folder (not followed)"
    assert reasons["dangling.py"] == "dangling symlink"
    assert not any("secret.txt" in path for path in reasons)


def test_a_code_folder_reached_through_a_link_is_its_target(code, tmp_path):
    (tmp_path / "via").symlink_to(code, target_is_directory=True)
    selection = select(tmp_path / "via", environ={})
    assert selection.root == code.resolve() and selection.names == ("train.py",)


# -- the secret scan -----------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "kind"), [
    (f'BACKUP = "{AWS_KEY_ID}"\n', "an AWS access key id"),
    (f"aws_secret_access_key = {AWS_SECRET}\n", "an AWS secret access key"),
    (f'AWS_SECRET_ACCESS_KEY: "{AWS_SECRET}"\n', "an AWS secret access key"),
    (PEM, "a private key"),
    (SERVICE_ACCOUNT, "a Google Cloud service-account key"),
    (f"token = '{GITHUB}'\n", "a GitHub token"),
    (f"token = 'github_pat_{'A1b2' * 20}'\n", "a GitHub token"),
    (f"SLACK = '{SLACK}'\n", "a Slack token"),
    (f"login(token='{HUGGING_FACE}')\n", "a Hugging Face token"),
    (f"key = '{GOOGLE_API}'\n", "a Google API key"),
    (f"openai.api_key = '{OPENAI}'\n", "an OpenAI API key"),
])
def test_a_secret_in_a_file_to_upload_is_a_one_line_refusal(code, text, kind):
    write(code, "configs/prod.yaml", "# settings\n\n" + text)
    with pytest.raises(SecretFound) as caught:
        select(code, environ={})
    error = caught.value
    assert isinstance(error, UsageError) and error.status == ExitStatus.USAGE
    assert str(error.message) == f"refusing to upload configs/prod.yaml: line 3 looks like {kind}"
    assert ".launchignore" in error.hint and "\n" not in str(error)


@pytest.mark.parametrize("text", [
    "aws_secret_access_key = os.environ['AWS_SECRET_ACCESS_KEY']\n",
    "KEY_PREFIX = 'AKIA'\n",
    f"name = 'x{AWS_KEY_ID}'\n",                     # inside a longer word
    "model = AutoModel.from_pretrained(hf_model_name_or_path_for_the_tokenizer)\n",
    '{"type": "service_account", "client_email": "a@p.iam.gserviceaccount.com"}\n',
    "# a key file starts with -----BEGIN ... PRIVATE KEY-----\n",
    "gh_token = os.environ['GITHUB_TOKEN']\n",
    # given to the environment, but not as a literal of the secret's shape
    "os.environ.get('AWS_SECRET_ACCESS_KEY')\n",
    'os.environ["AWS_SECRET_ACCESS_KEY"] = secret_access_key\n',
    'os.environ["AWS_SECRET_ACCESS_KEY"] = args.aws_secret_access_key_for_the_training_run\n',
    'os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "")\n',
    'os.environ["WANDB_API_KEY"] = "xxx"\n',
    'os.putenv("GITHUB_TOKEN", "<your key>")\n',
    'os.environ.update(AWS_SESSION_TOKEN="${AWS_SESSION_TOKEN}")\n',
    'environ["HF_TOKEN"] = "changeme"\n',
    'environ["OPENAI_API_KEY"] = os.environ.get("OPENAI_API_KEY", "")\n',
    json.dumps({"source": ['os.environ["AWS_SECRET_ACCESS_KEY"] = getpass()\n',
                           'os.environ["WANDB_API_KEY"] = "<your W&B key>"\n']}),
])
def test_code_that_only_mentions_secrets_is_uploaded(code, text):
    write(code, "config.py", text)
    assert "config.py" in select(code, environ={}).names


@pytest.mark.parametrize(("line", "kind"), [
    (f'os.environ["AWS_SECRET_ACCESS_KEY"] = "{AWS_SECRET}"', "an AWS secret access key"),
    (f"os.environ['AWS_SECRET_ACCESS_KEY']='{AWS_SECRET}'", "an AWS secret access key"),
    (f'os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "{AWS_SECRET}")', "an AWS secret access key"),
    (f'os.environ.update(AWS_SECRET_ACCESS_KEY="{AWS_SECRET}")', "an AWS secret access key"),
    (f'os.environ.update({{"AWS_SECRET_ACCESS_KEY": "{AWS_SECRET}"}})', "an AWS secret access key"),
    (f'os.putenv("AWS_SECRET_ACCESS_KEY", "{AWS_SECRET}")', "an AWS secret access key"),
    (f'environ["AWS_SECRET_ACCESS_KEY"] = "{AWS_SECRET}"', "an AWS secret access key"),
    (f'os.environ["AWS_SESSION_TOKEN"] = "{AWS_SESSION}"', "an AWS session token"),
    (f"AWS_SECURITY_TOKEN={AWS_SESSION}", "an AWS session token"),
    (f'os.environ.setdefault("WANDB_API_KEY", "{WANDB}")', "a Weights & Biases API key"),
    (f'os.environ["WANDB_API_KEY"] = "local-{WANDB}"', "a Weights & Biases API key"),
    (f'os.putenv("GITHUB_TOKEN", "{GITHUB_CLASSIC}")', "a GitHub token"),
    (f"environ['GH_TOKEN'] = '{GITHUB_CLASSIC}'", "a GitHub token"),
    # the secrets with a shape of their own are found by it, however they are given
    (f'os.environ["GITHUB_TOKEN"] = "{GITHUB}"', "a GitHub token"),
    (f'os.environ["HF_TOKEN"] = "{HUGGING_FACE}"', "a Hugging Face token"),
    (f'os.putenv("HUGGING_FACE_HUB_TOKEN", "{HUGGING_FACE}")', "a Hugging Face token"),
    (f'os.environ.setdefault("GOOGLE_API_KEY", "{GOOGLE_API}")', "a Google API key"),
    (f'os.environ["OPENAI_API_KEY"] = "{OPENAI}"', "an OpenAI API key"),
])
def test_a_secret_given_to_the_environment_in_python_is_refused(code, line, kind):
    write(code, "setup_env.py", f"import os\nfrom os import environ\n{line}\nprint('ready')\n")
    with pytest.raises(SecretFound) as caught:
        select(code, environ={})
    assert caught.value.message == f"refusing to upload setup_env.py: line 3 looks like {kind}"
    assert not any(secret in str(caught.value) for secret in (
        AWS_SECRET, AWS_SESSION, WANDB, GITHUB_CLASSIC, GITHUB, HUGGING_FACE, GOOGLE_API, OPENAI))


@pytest.mark.parametrize(("line", "kind"), [
    (f'os.environ["AWS_SECRET_ACCESS_KEY"] = "{AWS_SECRET}"\n', "an AWS secret access key"),
    (f'os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "{AWS_SECRET}")\n',
     "an AWS secret access key"),
    (f'AWS_SECRET_ACCESS_KEY = "{AWS_SECRET}"\n', "an AWS secret access key"),
    (f'os.environ["WANDB_API_KEY"] = "{WANDB}"\n', "a Weights & Biases API key"),
])
def test_a_secret_in_a_notebooks_source_is_refused(code, line, kind):
    """A notebook is JSON: its source lines are strings, their quotes escaped as ``\\"``."""
    notebook = {
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": ["# Fine-tune\n", "Keys first."]},
            {"cell_type": "code", "execution_count": 1, "id": "a1", "metadata": {}, "outputs": [],
             "source": ["import os\n", line, "print('ready')"]},
        ],
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                    "name": "python3"}},
        "nbformat": 4, "nbformat_minor": 5,
    }
    text = json.dumps(notebook, indent=1)
    assert '\\"' in text  # the quotes of a notebook's source are escaped
    number = next(n for n, row in enumerate(text.splitlines(), 1) if "_KEY" in row)
    write(code, "notebooks/explore.ipynb", text)
    with pytest.raises(SecretFound) as caught:
        select(code, environ={})
    assert caught.value.message == (
        f"refusing to upload notebooks/explore.ipynb: line {number} looks like {kind}")


@pytest.mark.parametrize(("text", "line", "kind"), [
    (AWS_PROFILE, 4, "a hard link to an AWS credentials file"),
    (USER_ADC, 4, "a hard link to a Google Cloud credentials file"),
])
def test_a_hard_link_to_a_credentials_file_is_refused_whatever_its_name(
        code, tmp_path, text, line, kind):
    credentials = write(tmp_path / "home", ".aws/credentials", text)
    # A copy is one more file, scanned for secret shapes, which these hold none of.
    write(code, "notes.txt", text)
    os.link(code / "train.py", tmp_path / "train-backup.py")  # code with two links is code
    assert select(code, environ={}).names == ("notes.txt", "train.py")

    (code / "notes.txt").unlink()
    os.link(credentials, code / "notes.txt")
    os.link(credentials, code / "credentials")  # left out by its name, link or not
    with pytest.raises(SecretFound) as caught:
        select(code, environ={})
    assert caught.value.message == f"refusing to upload notes.txt: line {line} looks like {kind}"
    assert [f.name for f in caught.value.findings] == ["notes.txt"]
    assert "7d1e" not in str(caught.value) and "1//0g" not in str(caught.value)


def test_the_launchers_own_source_has_no_secret_shape():
    assert packaging.scan_bytes(Path(packaging.__file__).read_bytes()) is None


def test_files_left_out_are_not_scanned_and_every_finding_is_counted(code):
    write(code, ".env", f"AWS_ACCESS_KEY_ID={AWS_KEY_ID}\n")
    write(code, "old/keys.txt", PEM)
    write(code, ".launchignore", "old/\n")
    assert select(code, environ={}).names == ("train.py",)

    write(code, "a.py", f"K = '{AWS_KEY_ID}'\n")
    write(code, "b.cfg", f"token={GITHUB}\n")
    write(code, "c.txt", PEM)
    with pytest.raises(SecretFound) as caught:
        select(code, environ={})
    assert caught.value.message == ("refusing to upload a.py: line 1 looks like an AWS access key "
                                    "id (and 2 more file(s): b.cfg, c.txt)")
    assert [f.name for f in caught.value.findings] == ["a.py", "b.cfg", "c.txt"]


def test_a_secret_across_two_read_blocks_is_found_on_its_line(code, monkeypatch):
    monkeypatch.setattr(packaging, "READ_BLOCK", 64)
    text = "".join(f"line {n}\n" for n in range(1, 40)) + f"   KEY = '{AWS_KEY_ID}'\n"
    offset = text.index("AKIA")
    assert offset % 64 > 64 - 20  # the key starts in one block and ends in the next
    write(code, "big.py", text)
    with pytest.raises(SecretFound, match="big.py: line 40 looks like an AWS access key id"):
        select(code, environ={})


def test_only_the_first_scan_limit_bytes_of_a_file_are_scanned(code, monkeypatch):
    monkeypatch.setattr(packaging, "READ_BLOCK", 1024)
    monkeypatch.setattr(packaging, "SCAN_LIMIT", 4096)
    write(code, "data.csv", "a,b\n" * 2048 + f"{AWS_KEY_ID},1\n")
    selection = select(code, environ={})
    data = next(f for f in selection.files if f.name == "data.csv")
    assert data.size == 8192 + len(AWS_KEY_ID) + 3  # hashed whole, scanned in part


# -- size and the listing ------------------------------------------------------------------------


def test_more_than_the_cap_is_refused_naming_the_largest_file(code, monkeypatch):
    monkeypatch.setattr(packaging, "MAX_UPLOAD_BYTES", 1000)
    write(code, "weights.bin", "0" * 900)
    write(code, "more.bin", "0" * 200)
    with pytest.raises(UsageError) as caught:
        select(code, environ={}, data_hint="S3")
    assert "holds 0 MiB to upload (largest: weights.bin" in caught.value.message
    assert "keep data and weights in S3" in caught.value.hint
    write(code, ".launchignore", "weights.bin\n")  # what is left out does not count
    assert select(code, environ={}).names == ("more.bin", "train.py")


def test_the_listing_is_plain_json(code):
    write(code, "run.sh", "#!/bin/sh\n", mode=0o755)
    write(code, ".env", "X=1\n")
    data = select(code, environ={}).to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data == {
        "root": str(code.resolve()),
        "files": [{"name": "run.sh", "bytes": 10, "executable": True},
                  {"name": "train.py", "bytes": 15, "executable": False}],
        "bytes": 25,
        "skipped": [{"path": ".env", "reason": "credential file name (.env)"}],
    }


def test_a_changed_file_is_not_packed_unscanned(code):
    selection = select(code, environ={})
    (code / "train.py").write_text(f"K = '{AWS_KEY_ID}'\n")
    with pytest.raises(UsageError, match="changed while the job was being packed"):
        selection.files[0].read()


# -- shared with the providers' tests ------------------------------------------------------------


def plant_secrets(code: Path, home: Path) -> Path:
    """Beside the script: the files issue 16 found in a staged archive (each holding a key, so a
    rule that let one through would also trip the scan), a link to a credentials file outside
    the folder, files that ``.launchignore`` and ``.gitignore`` exclude, and the code that goes.
    Returns the key file to name in ``GOOGLE_APPLICATION_CREDENTIALS`` (inside the folder)."""
    key = f"aws_access_key_id = {AWS_KEY_ID}\n"
    for name in (".env", ".aws/credentials", ".ssh/id_rsa", ".netrc", "aws/credentials"):
        write(code, name, key)
    write(code, "service-account.json", SERVICE_ACCOUNT)
    gac = write(code, "keys/gcp-key.json", SERVICE_ACCOUNT)
    outside = write(home, ".aws/credentials", key)
    (code / "aws-link").symlink_to(outside)
    write(code, ".launchignore", "data/\n*.ckpt\n")
    write(code, ".gitignore", "wandb/\n")
    write(code, "data/train.csv", key)
    write(code, "model.ckpt", key)
    write(code, "wandb/run.log", key)
    write(code, "model.py", "WIDTH = 16\n")
    write(code, "configs/base.yaml", "lr: 0.1\n")
    return gac


#: What :func:`plant_secrets` leaves in the package besides the script, and why the rest is out.
PLANTED_KEPT = ("configs/base.yaml", "model.py")
PLANTED_SKIPPED = {
    ".aws/": "hidden", ".ssh/": "hidden", ".env": "credential file name (.env)",
    ".netrc": "credential file name (.netrc)",
    "aws/credentials": "credential file name (credentials)",
    "service-account.json": "credential file name (*service-account*.json)",
    "keys/gcp-key.json": "named by GOOGLE_APPLICATION_CREDENTIALS",
    "data/": "listed in .launchignore", "model.ckpt": "listed in .launchignore",
    "wandb/": "listed in .gitignore",
    ".launchignore": "hidden", ".gitignore": "hidden",
}
