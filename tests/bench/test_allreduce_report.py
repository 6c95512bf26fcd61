"""tnt-bench allreduce's derived figures: speed-ups against MPI_Allreduce per layout, link bytes
against the bandwidth-optimal minimum, and the issue's goals in summary.json."""
import json

import pytest

from bench.allreduce import report
from bench.allreduce.run import parse_layouts


def row(layout, implementation, nbytes, seconds, sent=None, hosts=2, packets=None):
    values = {"layout": layout, "ranks": 4, "hosts": hosts, "bytes": nbytes, "implementation": implementation,
              "median_s": seconds, "min_s": seconds, "auto_choice": "hierarchical", "concurrent_memcpy_s": None,
              "load_average_1min": 1.0}
    if sent is not None:
        values.update(link_bytes_per_host=[sent, sent], link_bytes_max_host=sent,
                      link_bytes_minimum=2 * (hosts - 1) / hosts * nbytes)
    if packets is not None:
        values.update(link_packets_per_host=[packets] * hosts, link_packets_max_host=packets)
    return values


def test_goals_compare_auto_with_mpi_per_layout_and_link_bytes_with_the_minimum(tmp_path):
    mib = 1 << 20
    rows = [row("2x2", "mpi4py_MPI_Allreduce", mib, 0.010, sent=1.3 * mib),
            row("2x2", "tnt_auto", mib, 0.008, sent=1.05 * mib),
            row("2x2", "mpi4py_MPI_Allreduce", 4096, 0.001, sent=8000),
            row("2x2", "tnt_auto", 4096, 0.002, sent=9000),  # below 64 KiB: not part of the goals
            row("4x1", "mpi4py_MPI_Allreduce", mib, 0.010, sent=1.5 * mib, hosts=4, packets=40),
            row("4x1", "tnt_auto", mib, 0.020, sent=1.8 * mib, hosts=4, packets=50),
            row("4x1", "tnt_ring", mib, 0.016, sent=1.6 * mib, hosts=4),
            row("4x1", "tnt_rabenseifner", mib, 0.020, sent=1.5 * mib, hosts=4)]
    frame = report.derive(rows)
    auto = frame[frame["implementation"] == "tnt_auto"].set_index(["layout", "bytes"])
    assert auto.loc[("2x2", mib), "speedup_vs_mpi"] == pytest.approx(1.25)
    assert auto.loc[("2x2", mib), "link_bytes_vs_minimum"] == pytest.approx(1.05)
    assert auto.loc[("4x1", mib), "link_bytes_vs_minimum"] == pytest.approx(1.8 / 1.5)
    report.write(frame, {"machine": "test"}, str(tmp_path))
    goals = json.loads((tmp_path / "summary.json").read_text())["goals_from_64KiB"]
    assert goals["2x2"]["auto_at_least_as_fast_as_mpi"] and goals["2x2"]["link_bytes_within_10_percent"]
    assert not goals["4x1"]["auto_at_least_as_fast_as_mpi"] and not goals["4x1"]["link_bytes_within_10_percent"]
    assert (tmp_path / "allreduce_2x2.png").exists() and (tmp_path / "allreduce_4x1.svg").exists()
    # Whether auto's table picked the fastest algorithm asked for by name at that size.
    entries = {(e["layout"], e["bytes"]): e for e in json.loads((tmp_path / "summary.json").read_text())["auto_vs_mpi"]}
    assert entries[("4x1", mib)]["fastest_algorithm"] == "ring"
    assert entries[("4x1", mib)]["fastest_vs_auto"] == pytest.approx(1.25)
    assert "fastest_algorithm" not in entries[("2x2", mib)]  # no algorithm asked for by name there
    # Packets on the busiest host's link against MPI_Allreduce's (where they were counted).
    assert entries[("4x1", mib)]["link_packets_vs_mpi"] == pytest.approx(1.25)
    assert entries[("2x2", mib)]["link_packets_vs_mpi"] is None


def test_cluster_layouts_parse_and_bad_ones_are_named():
    assert parse_layouts("2x2, 4x1") == [(2, 2), (4, 1)]
    assert parse_layouts("") == []
    with pytest.raises(ValueError, match="'2by2' must read HOSTSxRANKS"):
        parse_layouts("2by2")
