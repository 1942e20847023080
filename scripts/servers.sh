# Shared by the scripts that start servers and bench them (sourced, not run): the
# Conveyor binary, the servers' process ids, their cleanup on exit, and waiting for one
# to be ready.
# The sourcing script sets $script_name (its name, for messages).

# $conveyor is $CONVEYOR, or bin/conveyor built from this tree now (go build is
# incremental), so that a stale binary is never the one measured.
if [ -n "${CONVEYOR:-}" ]; then
	conveyor=$CONVEYOR
else
	conveyor=$PWD/bin/conveyor
	go build -o "$conveyor" ./cmd/conveyor
fi

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# wait_ready URL PID LOG: waits until URL answers 200 (at most 20 minutes, as a first build
# of a 0.5B model takes minutes), or the process exits.
wait_ready() {
	for _ in $(seq 2400); do
		curl -sf -o /dev/null "$1" && return 0
		kill -0 "$2" 2>/dev/null || { echo "$script_name: server exited; see $3"; tail -5 "$3"; return 1; }
		sleep 0.5
	done
	echo "$script_name: $1 not ready; see $3"
	return 1
}

# down PID: stops a server and waits for it.
down() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }
