# Two commands on a fresh machine: `make demo` (set up, train the example on the local provider)
# and `make test` (set up, run the tests). Both create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch is installed first and pinned, so that pip takes a local CPU wheel where the machine has
# one (seconds) instead of resolving a multi-GB CUDA build. TORCH_PIP_ARGS can name a CPU index.
TORCH := torch==2.13.0
TORCH_PIP_ARGS ?=

.PHONY: setup demo test lint bench checkov clean chromium

$(BIN)/launch: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q "$(TORCH)" $(TORCH_PIP_ARGS)
	$(BIN)/pip install -q -e ".[dev]"
	touch $(BIN)/launch

setup: $(BIN)/launch

demo: setup
	$(BIN)/launch examples/tinygpt/train.py

# checkov pins an older boto3/botocore than the cloud SDKs here: it gets a virtualenv of its own.
CHECKOV := .venv-checkov/bin/checkov
$(CHECKOV):
	$(PY) -m venv .venv-checkov
	.venv-checkov/bin/pip install -q "checkov==3.3.30"

checkov: $(CHECKOV)
	$(CHECKOV) -d infra/aws --var-file infra/aws/example.tfvars --framework terraform --skip-download --compact --quiet
	$(CHECKOV) -d infra/gcp --var-file infra/gcp/example.tfvars --framework terraform --skip-download --compact --quiet

# The HTML plan report is checked in a real headless Chromium (tests/test_report_browser.py):
# Debian's package, installed where apt can (CI runs as root); elsewhere that test skips, and
# fails under CI=true.
chromium:
	@command -v chromium >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
	  [ "$$(id -u)" = 0 ] && { apt-get install -y -q chromium >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; }; }; } || \
	  echo "chromium is not installed: tests/test_report_browser.py will skip"

test: setup $(CHECKOV) chromium
	$(BIN)/python -m pytest -q -n 2 --dist worksteal --durations=15 -m "not timing"
	$(BIN)/python -m pytest -q -m timing

lint: setup
	$(BIN)/ruff check launcher trainer_templates tests bench examples

bench: setup
	$(BIN)/python bench/bench_cli_startup.py

clean:
	rm -rf $(VENV) .venv-checkov .launch
