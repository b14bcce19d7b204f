#!/usr/bin/env bash
# Refuses a time.Sleep in a test file unless it says why it sleeps (docs/testing.md, "Time
# in tests"): a comment "real time: <why>" on the same line or the line above (the store's
# clock must pass, a real process must get on), or "virtual time" for a sleep inside a
# testing/synctest bubble, where it costs nothing. Anything else is a guess at how long
# something takes: wait for the thing itself (internal/testutil/waitfor, synctest.Wait,
# Eventually) instead.
# hack/mongodev is a module of its own with its own rules and is not checked here.
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files -- '*_test.go' ':!:hack/mongodev/**')
[ -n "$files" ] || exit 0
# shellcheck disable=SC2086
awk '
  FNR == 1 { prev = "" }
  /time\.Sleep\(/ && $0 !~ /^[[:space:]]*\/\// {
    if ($0 !~ /(real|virtual) time/ && prev !~ /\/\/.*(real|virtual) time/) {
      printf "%s:%d: time.Sleep without a \"// real time: <why>\" comment\n", FILENAME, FNR
      bad++
    }
  }
  { prev = $0 }
  END {
    if (bad) {
      print "check-test-sleeps: wait for the condition itself (internal/testutil/waitfor, synctest, Eventually), or say why real time must pass" > "/dev/stderr"
      exit 1
    }
  }
' $files
