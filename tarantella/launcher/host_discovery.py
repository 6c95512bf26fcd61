"""The hosts an elastic job may use now: a discovery command's output, or the hostfile read again.

As Horovod's --host-discovery-script: the command prints one host per line, `host`, `host:K` or `host slots=K`
(the hostfile's syntax), and exits 0; it runs every --discovery-interval seconds while the job runs. Without
one, an elastic job started with --hostfile reads the file again at that interval, so editing it adds or
removes hosts. A change is taken at the next step's end (Note [Elastic generations] in elastic.py).
"""
from __future__ import annotations

import shlex
import subprocess
import sys

from .hostfile import HostfileError, parse_hostfile, read_hostfile

__all__ = ["HostSource"]

_RUN_SECONDS = 10.0


class HostSource:
    def __init__(self, script: str | None = None, hostfile: str | None = None, npernode: int | None = None):
        self.script, self.hostfile, self.npernode = script, hostfile, npernode
        self._complained = False

    @property
    def dynamic(self) -> bool:
        return bool(self.script or self.hostfile)

    def _text(self) -> tuple[str, str]:
        if self.script:
            done = subprocess.run(shlex.split(self.script), capture_output=True, text=True, timeout=_RUN_SECONDS,
                                  check=False)
            if done.returncode != 0:
                raise HostfileError(f"host discovery command {self.script!r} exited with code {done.returncode}: "
                                    f"{done.stderr.strip()[-200:]}")
            return done.stdout, f"the output of {self.script!r}"
        with open(self.hostfile, encoding="utf-8") as handle:
            return handle.read(), self.hostfile

    def hosts(self, strict: bool = False) -> tuple[tuple[str, int], ...] | None:
        """(host, ranks it takes) now; None when there is no source or it cannot be read this time (then the
        job goes on as it is, with one warning), unless `strict` (the job's start), which raises."""
        if not self.dynamic:
            return None
        try:
            text, source = self._text()
            hosts = parse_hostfile(text, source) if self.script else read_hostfile(self.hostfile)
        except (HostfileError, OSError, subprocess.TimeoutExpired) as error:
            if strict:
                raise HostfileError(str(error)) from None
            if not self._complained:
                self._complained = True
                print(f"tarantella: warning: elastic job: cannot read the hosts now ({error}); going on with "
                      f"the hosts it has", file=sys.stderr, flush=True)
            return None
        self._complained = False
        return tuple((host.name, self.npernode or host.slots or 1) for host in hosts)
