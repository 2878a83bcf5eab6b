#!/usr/bin/env bash
# Creates .venv with everything the project and its tests need, from a fresh
# Debian/Ubuntu machine with Python 3.11. Idempotent: the Makefile reruns it only
# when pyproject.toml or this script changes.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3

install_solvers() {
    if command -v glpsol >/dev/null && command -v cbc >/dev/null && command -v chromium >/dev/null; then
        return
    fi
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        if sudo -n true 2>/dev/null; then sudo="sudo -n"; else
            echo "setup: GLPK/CBC/Chromium missing and no root: run 'sudo apt-get install -y glpk-utils coinor-cbc chromium'; going on with HiGHS only." >&2
            return
        fi
    fi
    if command -v apt-get >/dev/null; then
        $sudo apt-get update -qq && $sudo apt-get install -y -qq glpk-utils coinor-cbc chromium >/dev/null \
            || echo "setup: apt-get could not install glpk-utils coinor-cbc chromium; going on with HiGHS only (and no report rendering test)." >&2
    else
        echo "setup: no apt-get: install GLPK (glpsol) and CBC with your package manager; going on with HiGHS only." >&2
    fi
}

install_solvers
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# The CPU wheel first, so the project's `torch` requirement is already met.
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[dev]"
