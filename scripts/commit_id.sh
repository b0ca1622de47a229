#!/usr/bin/env bash
# Prints the commit the GPU scripts record in device.txt: $LOCKS_COMMIT when set, else the
# checkout's HEAD, marked when tracked files differ from it (the device machine's copy of the
# git metadata can lag the copied tree: write this checkout's hash into the device command as
# LOCKS_COMMIT=abc1234 then, expanded here, not on the device).
if [ -n "${LOCKS_COMMIT:-}" ]; then
  echo "$LOCKS_COMMIT"
  exit 0
fi
c=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ "$c" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null | head -1)" ]; then
  c="$c + tracked files that differ from it (set LOCKS_COMMIT)"
fi
echo "$c"
