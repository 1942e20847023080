#!/usr/bin/env bash
# fuzz-short.sh runs every fuzz target of the repository for a short while, for CI.
#
# Targets are found by searching the test files of the main module's packages for lines
# "func FuzzXxx(f *testing.F)", so a new target is run without touching this script. go test
# fuzzes one target per invocation, so they run one after another. Each starts from its
# seeds, its package's testdata/fuzz/<Target>/ and the inputs cached from earlier runs.
#
# A crasher fails the run: go test has then written it to the package's
# testdata/fuzz/<Target>/, where it stays a regression input of the plain go test; this
# script prints that path (commit the file with the fix). All targets run even when one
# fails; the exit status is 1 when any failed.
#
# Environment:
#   FUZZTIME          time per target (default 5s: the 14 targets of today then take about
#                     2 to 2.5 minutes on 2 cores once the instrumented test binaries are in
#                     the build cache; a cold cache adds a few minutes of builds)
#   FUZZMINIMIZETIME  time to minimize a crasher or a new interesting input (default 2s;
#                     go test's 60s would eat the whole run on new coverage)
#   FUZZPARALLEL      fuzzing workers per target (default: GOMAXPROCS)
#   FUZZ_TARGETS      a regular expression: run only the targets whose name matches it
#   CONVEYOR_ORT_LIB, CONVEYOR_TOKENIZER_FILES
#                     passed to the tests; when unset they default to this checkout's
#                     .ort/libonnxruntime.so.1 and .tokenizers (made by make ort,
#                     make tokenizer-files) when those exist.
#
# Usage: scripts/fuzz-short.sh            (from anywhere in the repository)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
go=${GO:-go}
root=$("$go" list -m -f '{{.Dir}}')
fuzztime=${FUZZTIME:-5s}
minimizetime=${FUZZMINIMIZETIME:-2s}

if [[ -z ${CONVEYOR_ORT_LIB:-} && -e $root/.ort/libonnxruntime.so.1 ]]; then
	CONVEYOR_ORT_LIB=$root/.ort/libonnxruntime.so.1
fi
if [[ -z ${CONVEYOR_TOKENIZER_FILES:-} && -d $root/.tokenizers ]]; then
	CONVEYOR_TOKENIZER_FILES=$root/.tokenizers
fi
export CONVEYOR_ORT_LIB CONVEYOR_TOKENIZER_FILES

# Every "<package dir> <target>" of the main module, the directory as ./path (go list
# leaves out testdata and nested modules such as third_party/gonja).
targets=()
while read -r dir; do
	for file in "$dir"/*_test.go; do
		[[ -e $file ]] || continue
		while read -r name; do
			if [[ -z ${FUZZ_TARGETS:-} || $name =~ $FUZZ_TARGETS ]]; then
				targets+=(".${dir#"$root"} $name")
			fi
		done < <(sed -nE 's/^func (Fuzz[[:alnum:]_]*)\([[:alnum:]_]+ \*testing\.F\).*/\1/p' "$file")
	done
done < <("$go" list -e -f '{{.Dir}}' ./...)

if ((${#targets[@]} == 0)); then
	echo "fuzz-short: no fuzz targets found" >&2
	exit 1
fi
echo "fuzz-short: ${#targets[@]} targets, ${fuzztime} each"

log=$(mktemp)
trap 'rm -f "$log"' EXIT
failed=()
start=$SECONDS
for target in "${targets[@]}"; do
	read -r dir name <<<"$target"
	t0=$SECONDS
	args=(test "$dir" -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" -fuzzminimizetime "$minimizetime")
	if [[ -n ${FUZZPARALLEL:-} ]]; then
		args+=(-parallel "$FUZZPARALLEL")
	fi
	if "$go" "${args[@]}" >"$log" 2>&1; then
		echo "ok    $dir $name ($((SECONDS - t0))s)"
		continue
	fi
	# go test can report the fuzzing time running out while a worker still minimizes a new
	# input as "context deadline exceeded", with no failing input: that is no crasher, so
	# the target runs once more (its new inputs are cached by then), and only a second
	# failure counts.
	if grep -q 'context deadline exceeded' "$log" && ! grep -q 'Failing input written' "$log" &&
		"$go" "${args[@]}" >"$log" 2>&1; then
		echo "ok    $dir $name ($((SECONDS - t0))s, after the fuzzing deadline cut a minimization short)"
		continue
	fi
	failed+=("$dir $name")
	echo "FAIL  $dir $name ($((SECONDS - t0))s)"
	sed 's/^/      /' "$log"
	# go test names the file relative to the package directory.
	saved=$(sed -nE 's/^[[:space:]]*Failing input written to (.*)$/\1/p' "$log" | tail -n 1)
	if [[ -n $saved ]]; then
		echo "      crasher saved as $dir/$saved (a regression input of go test $dir from now on)"
		echo "      rerun: go test $dir -run '^${name}/$(basename "$saved")\$'"
	else
		echo "      (no input written: the package did not build, or a saved input or seed fails)"
	fi
done

echo "fuzz-short: ${#targets[@]} targets in $((SECONDS - start))s, ${#failed[@]} failed"
if ((${#failed[@]} > 0)); then
	printf '  %s\n' "${failed[@]}"
	exit 1
fi
