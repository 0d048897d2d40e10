#!/usr/bin/env bash
# Set-up command (a): installs every dependency, configures, builds, and runs the demo.
source "$(dirname "$0")/common.sh"

install_system_packages
install_python
configure_and_build
"$ROOT/scripts/demo.sh"
