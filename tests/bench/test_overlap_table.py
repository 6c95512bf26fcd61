"""bench.data_parallel's overlap table from run rows (pure Python, no TensorFlow, no MPI)."""
import pytest

from bench.data_parallel import _selected, overlap_markdown, overlap_table

pytestmark = pytest.mark.timeout(60)


def _row(mode, step_times, share=None, exposed=None, busy=None, model="resnet50_small", ranks=2):
    row = {"model": model, "mode": mode, "ranks": ranks, "step_times_s": step_times}
    if share is not None:
        row["communication"] = {"overlap_share": share, "exposed_s": exposed, "communication_s": busy,
                                "timeline": f"timelines/{model}_{mode}.json"}
    return row


def test_overlap_table_means_runs_and_keeps_missing_figures_empty():
    rows = [_row("tnt", [1.0, 1.2, 1.1], 0.8, 0.02, 0.1), _row("tnt", [1.3], 0.6, 0.04, 0.1),
            _row("tnt_no_overlap", [1.4, 1.5], 0.0, 0.09, 0.09), _row("tnt", [0.9], 0.1, 0.5, 0.5, ranks=1),
            _row("tnt", [2.0], model="transformer_small")]  # a run recorded without a timeline
    table = overlap_table(rows, ["resnet50_small", "transformer_small"])
    on, off = table["resnet50_small"]["overlap_on"], table["resnet50_small"]["overlap_off"]
    assert on["runs"] == 2 and on["overlap_share"] == pytest.approx(0.7)
    assert on["exposed_communication_s"] == pytest.approx(0.03) and on["allreduce_busy_s"] == pytest.approx(0.1)
    assert on["median_step_time_s"] == pytest.approx(1.15)  # pooled steps of both runs, 1 rank left out
    assert off["overlap_share"] == 0.0 and off["median_step_time_s"] == pytest.approx(1.45)
    transformer = table["transformer_small"]
    assert transformer["overlap_on"]["overlap_share"] is None and transformer["overlap_on"]["median_step_time_s"] == 2.0
    assert transformer["overlap_off"]["runs"] == 0
    text = overlap_markdown(table)
    assert "| resnet50_small | on | 70% | 30.0 ms | 100.0 ms | 1150.0 ms |" in text
    assert "| transformer_small | off | - | - | - | - |" in text


def test_configs_are_selected_by_name():
    configs = (("keras", 1), ("tnt", 2), ("tnt_no_overlap", 2))
    assert _selected(configs, None) == configs
    assert _selected(configs, ["tnt:2", "tnt_no_overlap:2"]) == configs[1:]
    with pytest.raises(SystemExit, match=r"unknown --configs \['tnt:9'\]"):
        _selected(configs, ["tnt:9"])
