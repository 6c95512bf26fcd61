"""tarantella: run a program on several ranks (processes), over MPI.

    tarantella [options] [--] program [args]

The program runs once per rank. A program ending in .py runs with the Python
interpreter (--python-interpreter); anything else runs as a binary. `--` ends the
launcher's options; it may be left out when the program is the first word that is
not an option, and is needed when the program starts with '-' (`-- -m module`).

Recipes
  tarantella -n 4 -- train.py --epochs 2        4 ranks on this host
  tarantella --hostfile hosts -- train.py       on the listed hosts, each taking its
                                                slots (1 if none given) ranks
  tarantella -H node1:2,node2:2 -- train.py     2 ranks on each of two hosts
  tarantella --hostfile hosts --network-interface ib0 -- train.py
                                                MPI traffic over ib0 only
  tarantella --hostfile hosts --launch-agent "ssh -p 2222" -- train.py
                                                daemons started over ssh on port 2222
  tarantella --hostfile hosts --npernode 2 --pin-to-socket -- train.py
                                                2 ranks per host, one per socket
  tarantella -n 2 --output-on-all-devices -- train.py
                                                every rank's output, lines tagged "[rank] "
  tarantella -n 2 -x TF_CPP_MIN_LOG_LEVEL=2 -- train.py
                                                a variable for every rank
  tarantella -n 2 --python-interpreter="valgrind --leak-check=yes python" -- test.py
  tarantella -n 2 --python-interpreter= -- ./a.out    a binary (so is any non-.py program)
  tarantella -n 2 --dry-run -- train.py         print the command, run nothing
  salloc -N 2 --ntasks-per-node 4 tarantella -- train.py
                                                in Slurm: SLURM_NTASKS ranks on the
                                                allocation's nodes (mpirun inside it)
  sbatch -n 8 -c 4 --wrap "tarantella -- train.py"  8 ranks of 4 threads each

Definitions
  rank          one process of the job, numbered 0..n-1; rank 0 is the master rank
  node, host    a machine; the local rank is a rank's number among those on its host
  slots         how many ranks a host of the hostfile takes when --npernode is absent
  socket        a NUMA node with CPUs, as `numactl --hardware` lists them

Placement
  -n N, no hostfile         N ranks on this host (Slurm: on the allocation's nodes,
                            at most SLURM_NTASKS)
  --hostfile F              hosts from F, each taking --npernode ranks, or its slots;
                            n is their sum, or -n N fills the hosts in file order
  -H h1:K1,h2:K2            the same hosts and slots on the command line (`h1` = `h1:1`)
  nothing                   1 rank (Slurm: SLURM_NTASKS ranks if set)
  Hostfile lines: `host`, `host slots=K` or `host:K`; `#` starts a comment.

Flags (units and defaults)
  -n N, -np N               number of ranks; default: see Placement
  --hostfile FILE           hosts to run on (alias -hostfile, as mpirun spells it);
                            default: this host
  -H, --host HOST:N,...     hosts and their slots (aliases mpirun's -host and MPICH's
                            -hosts); not with --hostfile
  --launch-agent CMD        how mpirun starts its daemon on another host: CMD HOST
                            COMMAND must run COMMAND there; default: ssh. Open MPI:
                            --mca plm_rsh_agent CMD; MPICH: -launcher-exec CMD
  --network-interface X     the interface (ib0) or IPv4 subnet (10.1.0.0/16) MPI's TCP
                            traffic uses; this host must have it. Open MPI: --mca
                            btl_tcp_if_include X --mca oob_tcp_if_include X; MPICH:
                            -iface X (names only); default: what the MPI chooses
  --npernode N, -N N        ranks per host (aliases --n-per-node, --devices-per-node,
                            mpirun's -N and -npernode, MPICH's -ppn; srun's -N counts
                            nodes: use -H or --hostfile); default: each host's slots
                            (no hostfile: n)
  -x KEY=VALUE, -x KEY      export KEY=VALUE to every rank, or KEY with the value it has
                            in the launcher's environment (as mpirun -x KEY; an error if
                            KEY is not set there); repeatable
  --bind-to core|none|socket
                            mpirun's binding. core, the default: local rank i of L
                            runs on the i-th of L equal blocks of its host's cores
                            (with their hardware threads), where every rank gets at
                            least one core and outside Slurm (there srun's --cpu-bind
                            binds); a rank alone on its host keeps all of them. none:
                            unbound. socket (or numa, package): --pin-to-socket
  --map-by slot|ppr:N:node  mpirun's mapping: slot is what tarantella always does (fill
                            each host's slots in order); ppr:N:node means --npernode N;
                            other mappings (node, socket, ...) are refused
  --pin-to-socket           run local rank i under `numactl --cpunodebind=S --preferred=S`,
                            S the i-th socket: at most one rank per socket; off by default
  --pin-memory-to-socket    the same with --membind=S (memory only from S); implies
                            --pin-to-socket; off by default
  --python-interpreter STR  command that runs .py programs, split like a shell would;
                            default: the interpreter running tarantella ({python});
                            "" runs the program as a binary
  --dry-run                 print the full command, shell-quoted on one line, and exit 0
  --version                 print the version and exit

{settings}

What every rank receives in its environment
  TNT_*                     every runtime setting above, resolved: the flag, else -x,
                            else the launcher's environment, else the default
  TNT_LAUNCHED=1            the program was started by this launcher
  TNT_WORLD_SIZE=n          the number of ranks started; a rank whose MPI world has
                            another size stops at tnt.init() with WorldSizeError
  -x variables              as given
  OMP_NUM_THREADS, TF_NUM_INTRAOP_THREADS
                            the rank's share of its host's CPUs (the CPUs of its
                            cores when bound to them, else CPUs // ranks on the host,
                            at least 1; pinned: the CPUs of its socket), unless set
                            in the launcher's environment or with -x
  TF_NUM_INTEROP_THREADS    1 where the rank's share is one CPU (two would only take
                            turns on it), else 2, unless set
  plus what the MPI sets (OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID, ...). Other
  variables of the launcher's environment reach the ranks on this host only (Open
  MPI and MPICH do not copy them to other hosts): pass them with -x.

Output
  By default only the master rank is heard: its stdout and stderr pass unchanged;
  other ranks' stdout is discarded and their stderr is kept back (its last lines are
  shown if the rank fails). --output-on-all-devices shows stdout and stderr of all
  ranks, --log-on-all-devices the stderr of all ranks; then every shown line starts
  with "[rank] ". Lines of different ranks may interleave.

Failures and exit codes
  The first rank whose program fails (non-zero exit code, or killed by a signal)
  ends the job: the MPI stops the other ranks at once, and if the job still runs
  4 s later the launcher stops it (SIGTERM to mpirun, SIGKILL 2 s later). The
  report's first line names that rank, its host, how it ended and its last
  exception line; then its last lines of stderr. A rank that hangs (stopped, or on
  a host whose network is gone) is found by the others' collectives after
  --timeout; they fail and end the job. tarantella exits with the failed rank's
  exit code (128 + N for a rank killed by signal N), 0 when all ranks succeed,
  and 2 for a launch that cannot start: bad options, a missing or empty hostfile,
  no program, no mpirun, no numactl for pinning, more pinned ranks per host than
  sockets, and ranks that could not be started on some host (mpirun ended, or not
  every rank started within --launch-timeout): one line naming the host.
  Ctrl-C or SIGTERM stop the job.

Elastic jobs
  --elastic                 a job that loses ranks goes on with the others: when a
                            rank is killed, hangs past --timeout or sits on a host
                            whose network is gone, the launcher ends that generation
                            of the job and starts the next one on the rest (a killed
                            rank gives up its slot, a silent host is dropped whole);
                            its ranks restore the last commit and train on with the
                            same global batch. tnt.Model.fit commits after every step
                            (weights, optimizer, metrics, the data's position); a
                            program failing on its own still ends the job
  --min-ranks M             elastic: fewer than M ranks left ends the job; default 1
  --commit-dir DIR          elastic: where each host keeps its copy of the commits;
                            default: a directory of the job's in /dev/shm (memory),
                            removed when the job ends
  --host-discovery-script CMD
                            elastic: CMD prints the hosts the job may use now, one
                            per line (`host`, `host:K`, `host slots=K`); run every
                            --discovery-interval seconds (default 5). Without it, a
                            --hostfile is read again at that interval. When the hosts
                            change, the ranks leave at the end of a step, committed,
                            and the next generation runs on the new hosts
  --max-ranks N             elastic: grow to at most N ranks; default: every slot
  --commit-every N          elastic: commit every N steps (and at every epoch's end);
                            default 1. A loss then redoes up to N-1 steps (from the
                            commit: the result is the same)

Mechanics
  The launcher runs `mpirun` found next to its Python interpreter, else on PATH
  (Open MPI or MPICH, told apart by `mpirun --version`), also inside a Slurm
  allocation (SLURM_JOB_ID set): there mpirun reads the allocation's nodes and
  tasks and starts its daemons with srun, while srun alone would give Open MPI 5
  ranks that each are alone in a world of 1 (no PMIx). Only where no mpirun is
  found does it use srun. Settings reach the ranks through mpirun's -x, so sbatch
  --export=NONE does not lose them; sbatch -c C gives each rank C threads
  (OMP_NUM_THREADS, TF_NUM_INTRAOP_THREADS). Open MPI gets --bind-to none (its
  default would bind each rank, threads and all, to one core; the rank wrapper binds
  each rank to its share of the cores instead, --bind-to core), --allow-run-as-root
  when run as root, and --oversubscribe when more ranks than physical cores run on
  this host outside Slurm. Every rank runs the program under
  tarantella/launcher/rank_wrapper.py (threads, pinning, output, start and exit
  records); interpreter and wrapper must exist at the same paths on every host.
  --log-level INFO or DEBUG also prints the command.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Sequence

from . import mpirun_dialect, pinning
from tarantella.config import load_config

from .hostfile import HostfileError
from .launch_check import LaunchProgress
from .launch_plan import PlanError, make_plan
from .network import NetworkError
from .local_host import LocalHost, probe_local_host
from .mpi_detect import MpiLauncher, MpiNotFound, find_launcher
from .mpirun_command import build_command, format_command
from .setting_flags import SettingValueError, add_setting_flags, settings_manual
from .elastic import capped, run_elastic
from .host_discovery import HostSource
from .supervisor import run_job

__all__ = ["main", "build_parser", "MANUAL"]

MANUAL = __doc__.replace("{python}", sys.executable).replace(
    "{settings}", "Runtime settings (from the table in tarantella/config.py)\n" + settings_manual())
USAGE_ERROR = 2


class UsageError(Exception):
    """Bad input: reported as one line `tarantella: error: ...`, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump
        raise UsageError(message)


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("tarantella")
    except Exception:  # not installed (run from a source tree)
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tarantella", usage="tarantella [options] [--] program [args]",
                     description=MANUAL[MANUAL.index("The program runs"):],
                     formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    parser.add_argument("-n", "-np", dest="nranks", type=int, metavar="N",
                        help="number of ranks (default: see Placement)")
    parser.add_argument("--hostfile", "-hostfile", metavar="FILE",
                        help="hosts to run on (default: this host)")
    parser.add_argument("-H", "--host", "-host", "-hosts", dest="host_list", metavar="HOST:N,...",
                        help="hosts and their rank counts, as a hostfile would give them "
                             "(mpirun --host, MPICH -hosts)")
    parser.add_argument("--npernode", "-N", "--n-per-node", "--devices-per-node", "-npernode", "-ppn",
                        dest="npernode", type=int, metavar="N",
                        help="ranks per host (default: each host's slots; no hostfile: n)")
    parser.add_argument("--launch-agent", metavar="CMD",
                        help="starts MPI's daemon on the other hosts instead of ssh "
                             "(Open MPI --mca plm_rsh_agent, MPICH -launcher-exec)")
    parser.add_argument("--network-interface", metavar="IF|SUBNET",
                        help="network for MPI's traffic (Open MPI --mca btl_tcp_if_include "
                             "and oob_tcp_if_include; MPICH -iface)")
    parser.add_argument("-x", dest="exports", action="append", default=[], metavar="KEY[=VALUE]",
                        help="export KEY=VALUE, or KEY with its value here (an error if unset), to every "
                             "rank; repeatable")
    parser.add_argument("--bind-to", metavar="core|none|socket", default=None,
                        help="mpirun's: core (the default: each rank on its share of the host's cores), none, "
                             "or socket/numa (= --pin-to-socket)")
    parser.add_argument("--map-by", metavar="slot|ppr:N:node", default=None,
                        help="mpirun's: slot (what tarantella does anyway) or ppr:N:node "
                             "(= --npernode N)")
    parser.add_argument("--pin-to-socket", action="store_true",
                        help="pin local rank i to socket i with numactl --cpunodebind --preferred")
    parser.add_argument("--pin-memory-to-socket", action="store_true",
                        help="as --pin-to-socket, with numactl --membind (memory only from it)")
    parser.add_argument("--python-interpreter", metavar="STR", default=None,
                        help=f"runs .py programs (default: {sys.executable}); '' runs a binary")
    parser.add_argument("--elastic", action="store_true",
                        help="go on with the other ranks when ranks or hosts are lost (see Elastic jobs)")
    parser.add_argument("--min-ranks", type=int, default=1, metavar="M",
                        help="elastic: end the job when fewer than M ranks are left (default 1)")
    parser.add_argument("--commit-dir", metavar="DIR", default=None,
                        help="elastic: where each host keeps its commits (default: one of the job's in /dev/shm)")
    parser.add_argument("--commit-every", type=int, default=None, metavar="N",
                        help="elastic: commit every N steps (default 1), and at every epoch's end")
    parser.add_argument("--max-ranks", type=int, default=None, metavar="N",
                        help="elastic: grow to at most N ranks (default: every slot of the hosts)")
    parser.add_argument("--host-discovery-script", metavar="CMD", default=None,
                        help="elastic: a command printing the hosts the job may use now, one per line")
    parser.add_argument("--discovery-interval", type=float, default=5.0, metavar="SECONDS",
                        help="elastic: how often the hosts are read again (default 5)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the command on one line and exit 0")
    parser.add_argument("--version", action="version", version=f"tarantella {_version()}")
    add_setting_flags(parser)
    parser.add_argument("program", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def _fail(message: str) -> int:
    print(f"tarantella: error: {message}", file=sys.stderr, flush=True)
    return USAGE_ERROR


def main(argv: Sequence[str] | None = None, *, environ=None, launcher: MpiLauncher | None = None,
         local_host: LocalHost | None = None,
         probe_numa: Callable[[], list] | None = None) -> int:
    """The `tarantella` command. The keyword arguments stand in for the machine in tests:
    the environment, the detected MPI, facts about this host, and the NUMA probe."""
    argv = sys.argv[1:] if argv is None else list(argv)
    environ = dict(os.environ if environ is None else environ)
    try:
        args = build_parser().parse_args(argv)
    except UsageError as error:
        return _fail(str(error))
    except SystemExit as done:  # --help, --version
        return done.code if isinstance(done.code, int) else 0
    if args.program[:1] == ["--"]:
        args.program = args.program[1:]
    if args.min_ranks < 1:
        return _fail(f"--min-ranks must be at least 1, got {args.min_ranks}")
    if args.max_ranks is not None and args.max_ranks < args.min_ranks:
        return _fail(f"--max-ranks {args.max_ranks} is below --min-ranks {args.min_ranks}")
    if args.discovery_interval <= 0:
        return _fail(f"--discovery-interval must be above 0 seconds, got {args.discovery_interval:g}")
    if args.commit_every is not None and args.commit_every < 1:
        return _fail(f"--commit-every must be at least 1 step, got {args.commit_every}")
    elastic_only = {"--min-ranks": args.min_ranks != 1, "--commit-dir": args.commit_dir is not None,
                    "--commit-every": args.commit_every is not None,
                    "--max-ranks": args.max_ranks is not None,
                    "--host-discovery-script": args.host_discovery_script is not None}
    if not args.elastic and any(elastic_only.values()):
        return _fail(f"{', '.join(flag for flag, given in elastic_only.items() if given)}: for elastic jobs; "
                     f"add --elastic")
    source = HostSource(args.host_discovery_script, args.hostfile, args.npernode)
    if args.host_discovery_script:
        if args.hostfile is not None or args.host_list is not None:
            return _fail("--host-discovery-script gives the hosts; leave out --hostfile and -H")
        try:
            args.host_list = ",".join(f"{host}:{count}" for host, count in capped(source.hosts(strict=True),
                                                                                   args.max_ranks))
        except HostfileError as error:
            return _fail(str(error))
    try:
        mpirun_dialect.apply(args)
        launcher = launcher or find_launcher(environ)
        plan = make_plan(args, environ, launcher.kind, probe_numa or pinning.probe_numa_nodes)
        command = build_command(plan, launcher, local_host or probe_local_host())
    except (PlanError, HostfileError, NetworkError, SettingValueError, MpiNotFound,
            pinning.PinningError) as error:
        return _fail(str(error))
    if args.dry_run:
        print(format_command(command), flush=True)
        return 0
    launch_timeout = load_config(plan.rank_env).launch_timeout_seconds
    verbose = plan.rank_env.get("TNT_LOG_LEVEL") in ("DEBUG", "INFO")
    if verbose:
        print(f"tarantella: {launcher.version}; running: {format_command(command)}", file=sys.stderr, flush=True)
    if args.elastic:
        return run_elastic(plan, launcher, local_host or probe_local_host(), min_ranks=args.min_ranks,
                           max_ranks=args.max_ranks, commit_dir=args.commit_dir, commit_every=args.commit_every,
                           source=source,
                           interval=args.discovery_interval, launch_timeout=launch_timeout, verbose=verbose)
    progress = LaunchProgress(plan.nranks, plan.hosts, plan.launch_agent)
    return run_job(command, launch=progress, launch_timeout=launch_timeout, verbose=verbose)
