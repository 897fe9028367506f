#!/usr/bin/env bash
# A script with no verl launch command in it.
set -x
echo "training..."
