"""Bring a namespace cluster up or down from a shell (see netns_cluster.py).

    python -m bench.cluster run --hosts 2 --slots 1 -- \\
        sh -c 'tarantella $NETNS_CLUSTER_ARGS -- prog.py'   up, run, always down
    python -m bench.cluster up --hosts 4 --slots 1        prints the cluster as JSON;
                                                          it lives until `down NAME`
    python -m bench.cluster down NAME | --stale | --all
    python -m bench.cluster list

`run` gives the command NETNS_CLUSTER_NAME, NETNS_CLUSTER_HOSTFILE, NETNS_CLUSTER_AGENT,
NETNS_CLUSTER_SUBNET and NETNS_CLUSTER_ARGS (the launcher options, shell-quoted) in
its environment, and removes the cluster when the command ends, fails or is
interrupted (SIGINT, SIGTERM). A cluster made by `up` belongs to the process that
called it (--owner-pid, default: the calling shell) and is removed as stale by
the next `up`/`run`/test session once that process has gone.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys

from tarantella.launcher.process_group import stop_process_group

from .netns_cluster import ClusterError, create, list_clusters, load, remove_stale


def _environment(cluster) -> dict[str, str]:
    return {"NETNS_CLUSTER_NAME": cluster.name, "NETNS_CLUSTER_HOSTFILE": cluster.hostfile,
            "NETNS_CLUSTER_AGENT": cluster.agent, "NETNS_CLUSTER_SUBNET": cluster.subnet,
            "NETNS_CLUSTER_ARGS": shlex.join(cluster.launcher_args())}


def _run(args) -> int:
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        raise ClusterError("run needs a command after --")

    def stop(signum, _frame):
        raise KeyboardInterrupt(signum)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, stop)
    cluster = create(args.hosts, args.slots)
    try:
        print(f"netns cluster {cluster.name}: {len(cluster.hosts)} hosts x {cluster.slots} "
              f"slots on {cluster.subnet}", file=sys.stderr, flush=True)
        process = subprocess.Popen(args.command, env={**os.environ, **_environment(cluster)},
                                   start_new_session=True)
        try:
            return process.wait()
        except KeyboardInterrupt:
            stop_process_group(process, grace_seconds=10)
            return 130
    finally:
        cluster.down()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="bring a cluster up and print it as JSON")
    run = sub.add_parser("run", help="bring a cluster up, run a command, bring it down")
    for each in (up, run):
        each.add_argument("--hosts", type=int, default=2, help="hosts (namespaces); default 2")
        each.add_argument("--slots", type=int, default=1, help="ranks per host; default 1")
    up.add_argument("--owner-pid", type=int, default=os.getppid(),
                    help="the cluster is stale once this process is gone (default: the shell)")
    run.add_argument("command", nargs=argparse.REMAINDER)
    down = sub.add_parser("down", help="remove a cluster")
    down.add_argument("name", nargs="?")
    down.add_argument("--stale", action="store_true", help="remove clusters of dead owners")
    down.add_argument("--all", action="store_true", help="remove every cluster")
    sub.add_parser("list", help="list clusters as JSON lines")
    args = parser.parse_args(argv)
    try:
        if args.action == "up":
            cluster = create(args.hosts, args.slots, owner_pid=args.owner_pid)
            print(json.dumps({**cluster.describe(), "environment": _environment(cluster)},
                             indent=1))
        elif args.action == "run":
            return _run(args)
        elif args.action == "down":
            if args.all:
                names = [cluster.name for cluster in list_clusters()]
            elif args.stale:
                names = remove_stale()
            else:
                if not args.name:
                    parser.error("down needs a NAME, --stale or --all")
                names = [args.name]
            for name in names if not args.stale else []:
                load(name).down()
            for name in names:
                print(f"removed {name}")
        else:
            for cluster in list_clusters():
                print(json.dumps(cluster.describe()))
    except ClusterError as error:
        print(f"bench.cluster: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
