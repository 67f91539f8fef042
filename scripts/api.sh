#!/bin/bash
# api.sh [REV]: the exported API of tfdist's public packages (every package
# outside internal/, examples/ and cmd/), one declaration per line as
# `go doc -all` prints it: functions, methods, types, variables and
# constants, each after its package's path. With REV, the API of that
# commit, listed from a temporary worktree. To see what a change did:
#
#	diff <(scripts/api.sh c1b7a34) <(scripts/api.sh)
set -euo pipefail
root=$(git rev-parse --show-toplevel)
dir=$root
if [ $# -gt 0 ]; then
	dir=$(mktemp -d)
	trap 'git -C "$root" worktree remove --force "$dir"' EXIT
	git -C "$root" worktree add --detach -q "$dir" "$1"
fi
cd "$dir"
eval "$(make -s env)"
for p in $(go list -f '{{if .GoFiles}}{{.ImportPath}}{{end}}' ./... | grep -v -e '/internal/' -e '/examples/' -e '/cmd/'); do
	go doc -all "$p" | grep -E '^(func|type|var|const) ([A-Z]|\()|^    func [A-Z]' |
		sed -E 's/^ +//; s/ *\{$//; s|^|'"${p#github.com/tfdist/tfdist/}"': |'
done | sort -u
