#!/usr/bin/env bash
# Set-up command (a): installs every dependency, configures, builds, builds the wheel (dist/), and runs the demo.
source "$(dirname "$0")/common.sh"

install_system_packages
install_python
configure_and_build
build_wheel
"$ROOT/scripts/demo.sh"
