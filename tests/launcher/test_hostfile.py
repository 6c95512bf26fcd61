"""Hostfile parsing."""
import pytest

from tarantella.launcher.hostfile import Host, HostfileError, parse_hostfile, read_hostfile


def test_hosts_slots_and_comments():
    text = """
    # the cluster
    node1                 # one slot
    node2 slots=4
    node3:2   # MPICH style
    10.0.0.7 slots=1
    """
    assert parse_hostfile(text) == [Host("node1", None), Host("node2", 4), Host("node3", 2),
                                    Host("10.0.0.7", 1)]


@pytest.mark.parametrize("text, message", [
    ("", "lists no host"),
    ("# nothing\n   \n", "lists no host"),
    ("node1 slots=0\n", "slots must be a whole number >= 1"),
    ("node1:x\n", "slots must be a whole number >= 1"),
    ("node1 slots=2 slots=3\n", "slots given twice"),
    ("node1:2 slots=3\n", "slots given twice"),
    ("node1 max_slots=4\n", "unexpected 'max_slots=4'"),
    ("node1\nnode1\n", "already listed on line 1"),
])
def test_bad_hostfiles(text, message):
    with pytest.raises(HostfileError, match=message):
        parse_hostfile(text, "hosts")


def test_errors_name_file_and_line():
    with pytest.raises(HostfileError, match=r"^hosts:3: "):
        parse_hostfile("a\n# b\nc slots=-1\n", "hosts")


def test_missing_file(tmp_path):
    with pytest.raises(HostfileError, match="does not exist"):
        read_hostfile(str(tmp_path / "nope"))
    (tmp_path / "hosts").write_text("a slots=2\n")
    assert read_hostfile(str(tmp_path / "hosts")) == [Host("a", 2)]
