# Sourced by the multi-process tests: waiting for processes with a deadline.
#
# await_exit SECONDS LOG_DIR PID...
#   Waits until every PID (a process this shell started, or the `timeout`
#   wrapper around one) has exited, for at most SECONDS in all. Past the
#   deadline it prints, for each process still running, the end of its logs
#   in LOG_DIR and the stacks of its threads (gdb where installed, else each
#   thread's kernel wait channel), then kills it: a hung process fails the
#   test with its state on record instead of stalling it until Bazel's
#   timeout. Returns the first nonzero exit status among PIDs, 124 for one
#   killed here.

# dump_process PID: what PID and its children are doing, for a hang report.
dump_process() {
  local p t
  for p in "$1" $(pgrep -P "$1" 2>/dev/null); do
    [ -r "/proc/$p/cmdline" ] || continue
    echo "---- pid $p: $(tr '\0' ' ' <"/proc/$p/cmdline" | cut -c1-300)"
    if command -v gdb >/dev/null 2>&1; then
      # Frames only, no arguments or locals: a few lines a thread.
      timeout 60 gdb -p "$p" -batch -nx -ex "set pagination off" -ex "set print frame-arguments none" \
        -ex "thread apply all bt 25" 2>/dev/null | grep -E '^(Thread|#)' | cut -c1-200
    else
      for t in /proc/"$p"/task/*; do
        echo "thread ${t##*/} $(cat "$t/comm" 2>/dev/null): $(cat "$t/wchan" 2>/dev/null)"
      done
    fi
  done
}

await_exit() {
  local limit="$1" dir="$2"; shift 2
  local deadline=$((SECONDS + limit))
  local rc=0 p st hung=()
  for p in "$@"; do
    while kill -0 "$p" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
    if kill -0 "$p" 2>/dev/null; then hung+=("$p"); continue; fi
    wait "$p"; st=$?
    [ "$rc" -ne 0 ] || rc=$st
  done
  [ ${#hung[@]} -gt 0 ] || return "$rc"
  echo "==== HUNG: ${#hung[@]} process(es) still running after $limit s; logs in $dir:"
  local f
  for f in "$dir"/*.log; do
    [ -f "$f" ] || continue
    echo "---- tail of $f"
    tail -n 30 "$f"
  done
  for p in "${hung[@]}"; do dump_process "$p"; done
  for p in "${hung[@]}"; do
    pkill -KILL -P "$p" 2>/dev/null
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  return 124
}
