#!/bin/sh
# autogen.sh: generate configure and Makefile.in (nothing generated is kept in git).
set -e
cd "$(dirname "$0")"
autoreconf --install --force
