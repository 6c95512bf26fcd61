"""python -m tarantella.timeline merge FILE     merge FILE.rank<R>.json (a job that did not end cleanly) into FILE
python -m tarantella.timeline overlap FILE   per rank and step: overlap share and exposed communication
                                             (Note [Overlap share] in tarantella/timeline/overlap.py)
python -m tarantella.timeline render FILE OUT.png [--step N]
                                             a picture of one step (default: the last one every rank
                                             recorded), one row per rank and track (needs matplotlib)"""
from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tarantella.timeline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("merge", "overlap", "render"))
    parser.add_argument("file", help="the trace file given to `tarantella --timeline`")
    parser.add_argument("output", nargs="?", help="render: the picture to write (.png, .svg, .pdf)")
    parser.add_argument("--skip-steps", type=int, default=1, help="overlap: leave out the first steps (tracing)")
    parser.add_argument("--step", type=int, default=None, help="render: the step to draw")
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
    if args.command == "render":
        from tarantella.timeline.render import render_step
        if not args.output:
            parser.error("render needs the picture to write: python -m tarantella.timeline render FILE OUT.png")
        try:
            step = render_step(args.file, args.output, args.step)
        except (ValueError, OSError) as error:  # RenderError, or a file that is no trace
            print(f"tarantella: cannot render {args.file}: {error}", file=sys.stderr)
            return 1
        print(f"step {step} of {args.file} drawn into {args.output}")
        return 0
    from tarantella.timeline.overlap import overlap_from_trace, overlap_summary
    rows = overlap_from_trace(args.file)
    for row in rows:
        print(json.dumps(row, sort_keys=True))
    print("summary " + json.dumps(overlap_summary(rows, args.skip_steps), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
