"""Test-run-wide hooks: the tests of one shared launch run one after the other (Note [Shared launches] in
tests/shared_launch.py)."""
import pytest

from tests.shared_launch import MARKER


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
