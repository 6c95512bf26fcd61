"""bench.fixed_cost's figures and goals from its rows (one process, no launch)."""
import pytest

from bench.fixed_cost import report, run


def _train(model, micro, mode, ranks, step_s):
    times = [[step_s] * 5 for _ in range(ranks)]
    return {"mode": mode, "ranks": ranks, "model": model, "micro_batch": micro, "rank_step_times_s": times,
            "step_times_s": times[0], "seconds": 1.0, "load_average_1m": 0.1}


def _collectives(model, bytes_, allreduce_s, reducer_s, memcpy_s):
    return {"mode": "collectives", "ranks": 2, "seconds": 1.0, "rows": [
        {"model": model, "gradient_bytes": bytes_, "buckets": 8, "buckets_in_shared_memory": True,
         "reducer_copies_per_byte": 2.0, "engine_allreduce_s": allreduce_s, "mpi_allreduce_s": 2 * allreduce_s,
         "reducer_step_s": reducer_s, "memcpy_s": memcpy_s}]}


def test_goals_are_computed_from_the_medians():
    rows = [_train("mlp8x512", 128, "keras", 1, 0.0120), _train("mlp8x512", 128, "tnt", 1, 0.0122),
            _train("mlp8x512", 128, "keras", 2, 0.0200),
            dict(_train("mlp8x512", 128, "tnt", 2, 0.0230), reducer_last_step=[
                {"buckets": 8, "busy_s": 0.002, "span_s": 0.004, "tail_s": 0.001},
                {"buckets": 8, "busy_s": 0.004, "span_s": 0.004, "tail_s": 0.003}]),
            _train("mlp8x512", 128, "tnt_metrics_after", 2, 0.0240),
            _collectives("mlp8x512", 8_404_992, 0.0010, 0.0015, 0.0005)]
    summary = report.summarize(rows)
    goals = summary["goals"]["mlp8x512:128"]
    assert goals["one_rank_overhead"] == pytest.approx(0.0122 / 0.0120 - 1)
    assert goals["one_rank_goal_met"] is True
    assert goals["added_over_no_exchange_s"] == pytest.approx(0.003)
    assert goals["added_vs_engine_allreduce"] == pytest.approx(3.0)
    assert goals["two_rank_goal_met"] is False  # 3 ms added > 1.5 x 1 ms
    assert goals["metric_fusion_saves_s"] == pytest.approx(0.001)
    assert goals["reduction_tail_s"] == pytest.approx(0.002) and goals["reduction_busy_s"] == pytest.approx(0.003)
    collectives = summary["collectives"]["mlp8x512"]
    assert collectives["reducer_vs_memcpy"] == pytest.approx(3.0)
    assert collectives["reducer_throughput_gb_s"] == pytest.approx(8_404_992 / 0.0015 / 1e9)
    text = report.markdown(summary)
    assert "| mlp8x512:128 | 12.00 ms | 12.20 ms | +1.7% met |" in text and "3.00 NOT met" in text
    assert "8.4 MB" in text


def test_bad_model_and_config_names_are_one_line_errors():
    with pytest.raises(SystemExit, match="unknown model 'nope'"):
        run._model_list(["nope:32"])
    with pytest.raises(SystemExit, match="MODEL:MICRO_BATCH"):
        run._model_list(["mlp8x512"])
    with pytest.raises(SystemExit, match="unknown --configs"):
        run._configs(["tnt:3"])
    assert run._configs(None) == run.TRAIN_CONFIGS + run.PAIRED_CONFIGS + (("collectives", 2),)


def _paired(model, micro, ranks, pairs):
    """pairs: [(keras_s, tnt_s)] alike on every rank."""
    return {"mode": "paired", "ranks": ranks, "model": model, "micro_batch": micro, "seconds": 1.0,
            "load_average_1m": 0.1, "rank_pairs": [[{"keras": k, "tnt": t} for k, t in pairs] for _ in range(ranks)],
            "reducer_last_step": [None] * ranks}


def test_paired_runs_give_the_goals_per_pair():
    rows = [_train("mlp8x512", 32, "keras", 1, 0.0100), _train("mlp8x512", 32, "tnt", 1, 0.0110),  # +10% apart
            _paired("mlp8x512", 32, 1, [(0.0100, 0.0101), (0.0120, 0.0122), (0.0100, 0.0099)]),
            _paired("mlp8x512", 32, 2, [(0.0050, 0.0062), (0.0060, 0.0071), (0.0055, 0.0064)]),
            _collectives("mlp8x512", 8_404_992, 0.0010, 0.0015, 0.0005)]
    goals = report.summarize(rows)["goals"]["mlp8x512:32"]
    assert goals["measured_by"] == {"one_rank": "paired", "two_ranks": "paired"}
    assert goals["one_rank_overhead"] == pytest.approx(0.01)  # per-pair ratios 1.01, 1.0167, 0.99: median
    assert goals["separate_launches"]["one_rank_overhead"] == pytest.approx(0.1)
    assert goals["one_rank_goal_met"] is True
    assert goals["added_over_no_exchange_s"] == pytest.approx(0.0011)  # per pair 1.2, 1.1, 0.9 ms
    assert goals["two_rank_goal_met"] is True
    text = report.markdown(report.summarize(rows))
    assert "+1.0% met (paired)" in text and "1.10 ms (paired)" in text
    assert "| mlp8x512:32 | 3 | 10.00 ms | 10.10 ms | +1.0% | 3 | 5.50 ms | 6.40 ms | 1.10 ms |" in text
    assert "paired x2" in report.one_line(rows[3])


def test_lockstep_fits_give_the_floor_of_any_synchronous_exchange():
    paired_x2 = _paired("digits_mlp", 32, 2, [(0.00050, 0.00070), (0.00060, 0.00075), (0.00055, 0.00070)])
    for rank in paired_x2["rank_pairs"]:  # lockstep adds 40, 30 and 35 us over Keras in the three pairs
        for pair, lockstep in zip(rank, (0.00054, 0.00063, 0.000585)):
            pair["lockstep"] = lockstep
    paired_x1 = _paired("digits_mlp", 32, 1, [(0.00050, 0.00051)])
    paired_x1["rank_pairs"][0][0]["lockstep"] = 0.000502
    collectives = _collectives("digits_mlp", 9_640, 0.000005, 0.00001, 0.000001)
    collectives["rows"][0]["barrier_s"] = 0.000001
    summary = report.summarize([paired_x1, paired_x2, collectives])
    goals = summary["goals"]["digits_mlp:32"]
    assert goals["lockstep_added_s"] == pytest.approx(35e-6) and goals["lockstep_call_s"] == pytest.approx(2e-6)
    assert goals["exchange_floor_s"] == pytest.approx(35e-6 - 1e-6)  # the lockstep wait (barrier excluded) > allreduce
    assert goals["floor_vs_engine_allreduce"] == pytest.approx(6.8)
    text = report.markdown(summary)
    assert "| digits_mlp:32 | 2 us | 35 us | 1 us | 5 us | 34 us | 6.80 | 150 us | 30.00 |" in text
    assert report._exchange_floor(0.010, 0.003, 0.000001) == 0.010  # a short wait: the allreduce bounds it
    assert "lockstep +35 us" in report.one_line(paired_x2)
    faster = _paired("digits_mlp", 32, 1, [(0.00050, 0.00049)])
    faster["rank_pairs"][0][0]["lockstep"] = 0.000499
    assert "-0.01 ms) lockstep -1 us" in report.one_line(faster)  # signs as measured, never "+-"
    # Runs from before the lockstep fit existed still summarize, without the floor.
    old = report.summarize([_paired("digits_mlp", 32, 2, [(0.0005, 0.0007)]),
                            _collectives("digits_mlp", 9_640, 0.000005, 0.00001, 0.000001)])
    assert old["goals"]["digits_mlp:32"]["exchange_floor_s"] is None
    assert "Lockstep:" not in report.markdown(old)


def test_summarize_only_rewrites_a_runs_summary_and_keeps_its_machine(tmp_path):
    import json
    row = _paired("digits_mlp", 32, 2, [(0.0005, 0.0007)])
    (tmp_path / "runs.jsonl").write_text(json.dumps(row) + "\n")
    (tmp_path / "summary.json").write_text(json.dumps({"machine": {"cores": 2}, "source": {"git_commit": "abc"},
                                                       "goals": {"stale": {}}}))
    assert run.main(["--summarize-only", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["machine"] == {"cores": 2} and summary["source"] == {"git_commit": "abc"}
    assert list(summary["goals"]) == ["digits_mlp:32"]
    assert "| digits_mlp:32 |" in (tmp_path / "summary.md").read_text()
    with pytest.raises(SystemExit, match="needs runs.jsonl and summary.json"):
        run.main(["--summarize-only", "--out", str(tmp_path / "empty")])
