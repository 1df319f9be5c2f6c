"""Checks the ps apply logs of tests/chaos_test.sh (lines from ps/apply_log.h).

usage: chaos_check.py JOB DISRUPTIONS_FILE APPLY_LOG...

DISRUPTIONS_FILE has one line per disruption, written just before it:
  "<k> <manifest_step> <lines of apply log 0> <lines of apply log 1> ..."
where manifest_step is the newest checkpoint the MANIFEST listed then (-1:
none) and the counts say how much of each apply log existed then.

For each apply log, the job's history is cut into segments, each starting at
a "create JOB 0" or "restore JOB R" line (a registration on that server,
fresh or from a checkpoint). Checked:
  - within a segment no (worker, step) is applied twice, and no step below
    the segment's start is applied (a restore never replays a step before
    its checkpoint);
  - every restore starts from a step this server saved (a "save JOB R" line
    earlier in its log), and a create or restore that follows a disruption
    starts at or after the newest checkpoint the MANIFEST listed when that
    disruption began: no server ever goes back past the last checkpoint;
  - an apply line outside any segment (a push to a job never registered
    since the server started) is an error.
Prints one summary line per log and "BAD: ..." per problem; exit 1 on any.
"""
import sys


def main():
    if len(sys.argv) < 4:
        print(__doc__)
        return 2
    job, disruptions_path, logs = sys.argv[1], sys.argv[2], sys.argv[3:]
    disruptions = []  # (manifest_step, [line counts per log])
    with open(disruptions_path) as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            disruptions.append((int(parts[1]), [int(x) for x in parts[2:]]))
    bad = []
    for i, path in enumerate(logs):
        with open(path) as f:
            lines = f.read().splitlines()
        saved = set()
        segment = None  # (start step, set of (worker, step))
        incarnation = None
        segments = restores = applies = 0
        max_step = -1
        for n, line in enumerate(lines, start=1):
            parts = line.split()
            if len(parts) < 3:
                bad.append("%s:%d: malformed line %r" % (path, n, line))
                continue
            inc, event, name = parts[0], parts[1], parts[2]
            if inc != incarnation:
                incarnation = inc
                segment = None  # a new process holds no job until registered
            if name != job:
                continue
            # The newest MANIFEST step among disruptions begun before this line.
            floor = max([m for m, counts in disruptions if counts[i] < n], default=-1)
            if event in ("create", "restore"):
                start = int(parts[3])
                if event == "restore" and start not in saved:
                    bad.append("%s:%d: restore at step %d, a step this server never saved"
                               % (path, n, start))
                if start < floor:
                    bad.append("%s:%d: %s at step %d, behind the checkpoint at step %d "
                               "listed before the disruption" % (path, n, event, start, floor))
                segment = (start, set())
                segments += 1
                restores += event == "restore"
            elif event == "apply":
                worker, step = int(parts[3]), int(parts[4])
                applies += 1
                max_step = max(max_step, step)
                if segment is None:
                    bad.append("%s:%d: apply of worker %d step %d with the job not registered"
                               % (path, n, worker, step))
                    continue
                if step < segment[0]:
                    bad.append("%s:%d: worker %d step %d applied below the restored step %d"
                               % (path, n, worker, step, segment[0]))
                if (worker, step) in segment[1]:
                    bad.append("%s:%d: worker %d step %d applied twice since the %s"
                               % (path, n, worker, step, "registration at step %d" % segment[0]))
                segment[1].add((worker, step))
            elif event == "save":
                saved.add(int(parts[3]))
            elif event == "delete":
                segment = None
        print("apply log %s: %d registrations (%d restores), %d pushes applied, last step %d, "
              "%d saves" % (path, segments, restores, applies, max_step, len(saved)))
    for b in bad[:50]:
        print("BAD: " + b)
    if len(bad) > 50:
        print("BAD: ... %d more" % (len(bad) - 50))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
