#!/usr/bin/env bash
# Prints the value of one of hack/kind/versions.sh's variables, for make: hack/kind/env.sh NAME.
set -euo pipefail
# shellcheck source=versions.sh
source "$(dirname "${BASH_SOURCE[0]}")/versions.sh"
echo "${!1}"
