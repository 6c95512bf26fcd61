"""Test-run-wide hooks: the extended tier runs only when asked for (Note [The suite's two tiers]); the tests of
one shared launch run one after the other (Note [Shared launches] in tests/shared_launch.py)."""
import pytest

from tests.shared_launch import MARKER


# Note [The suite's two tiers]
# On a 2-core machine without AVX-512 the whole suite took 1:55 h (results/test_suite/README.md, stop 54), and CI
# allows 90 minutes. A test marked `extended` is one whose behaviour a default-tier test already shows on a
# cheaper configuration: the same program at 4 ranks where 2 and 3 run by default (4 ranks on 2 cores cost
# twice 2 ranks, and 3 already divides unevenly), a further fault, input or planted defect of a kind whose
# first case runs, the across-hosts (or one-node) variant of a check that runs in the other setting. `pytest`
# runs the default tier (the README's test command, CI's); `pytest --extended` runs both tiers; a -m expression
# that names the marker decides alone (`-m extended`: the extended tier; any other -m, e.g. `-m multirank`,
# selects within the default tier). Deselected, not skipped: pytest's summary counts them as "deselected" (a
# test named on the command line is deselected too: add --extended), and a shared launch does not start the
# rank counts that only extended tests read.


def pytest_addoption(parser):
    parser.addoption("--extended", action="store_true",
                     help="also run the tests marked extended (Note [The suite's two tiers] in tests/conftest.py)")


def _deselect_extended(config, items):
    """Drop the extended tier unless --extended or a -m expression that names it asks for it."""
    if config.getoption("extended") or "extended" in (config.getoption("markexpr") or ""):
        return
    extended = [item for item in items if item.get_closest_marker("extended") is not None]
    if extended:
        config.hook.pytest_deselected(items=extended)
        kept = {id(item) for item in extended}
        items[:] = [item for item in items if id(item) not in kept]


def _launch_key(item):
    """(launch, n, program index) of a test marked by SharedLaunch.test, else None."""
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return None
    launch, name = marker.args
    program = next(p for p in launch.programs if p.name == name)
    params = getattr(item, "callspec", None)
    params = params.params if params else {}
    n = params.get("n", params.get("ranks"))
    if n is None:
        assert len(program.ranks) == 1, f"{item.nodeid}: give the rank count as parameter n or ranks"
        n = program.ranks[0]
    return launch, n, launch.programs.index(program)


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(session, config, items):
    yield   # after every other plugin has selected and ordered the items
    _deselect_extended(config, items)
    keys = {id(item): _launch_key(item) for item in items}
    groups, wanted = {}, {}
    for item in items:
        key = keys[id(item)]
        if key is not None:
            launch, n, index = key
            groups.setdefault((id(launch), n), []).append(item)
            wanted.setdefault(id(launch), (launch, set()))[1].add((launch.programs[index].name, n))
    for launch, pairs in wanted.values():
        launch.wanted = pairs
    ordered, placed = [], set()
    for item in items:
        key = keys[id(item)]
        if key is None:
            ordered.append(item)
            continue
        group = (id(key[0]), key[1])
        if group not in placed:
            placed.add(group)
            ordered.extend(sorted(groups[group], key=lambda member: keys[id(member)][2]))
    items[:] = ordered
