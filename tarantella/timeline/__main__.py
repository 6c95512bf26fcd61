"""python -m tarantella.timeline merge FILE     merge FILE.rank<R>.json (a job that did not end cleanly) into FILE
python -m tarantella.timeline overlap FILE   per rank and step: overlap share and exposed communication
                                             (Note [Overlap share] in tarantella/keras/overlap.py)"""
from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tarantella.timeline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("merge", "overlap"))
    parser.add_argument("file", help="the trace file given to `tarantella --timeline`")
    parser.add_argument("--skip-steps", type=int, default=1, help="overlap: leave out the first steps (tracing)")
    args = parser.parse_args(argv)
    if args.command == "merge":
        from tarantella.timeline.session import merge_rank_files
        try:
            path, count = merge_rank_files(args.file)
        except FileNotFoundError as error:
            print(error, file=sys.stderr)
            return 1
        print(f"merged {count} rank file(s) into {path}")
        return 0
    from tarantella.keras.overlap import overlap_from_trace, overlap_summary
    rows = overlap_from_trace(args.file)
    for row in rows:
        print(json.dumps(row, sort_keys=True))
    print("summary " + json.dumps(overlap_summary(rows, args.skip_steps), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
