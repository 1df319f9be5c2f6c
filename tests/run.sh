#!/usr/bin/env bash
# The project's test command: installs what is missing, then runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/setup.sh
bazel test --test_output=errors //... "$@"
