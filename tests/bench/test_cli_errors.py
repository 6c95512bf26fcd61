"""Bad input ends with one line `tnt-bench: error: ...` and exit code 2, before any run starts."""
import pytest


@pytest.mark.timeout(30)
@pytest.mark.parametrize("argv, says", [
    (["scaling", "--model", "resnet_tiny", "--devices", "0..4"], "device counts start at 1"),
    (["scaling", "--model", "resnet_tiny", "--devices", "4..1"], "runs backwards"),
    (["scaling", "--model", "resnet_tiny", "--devices", "abc"], "not a whole number"),
    (["scaling", "--model", "no_such_model"], "unknown model 'no_such_model'"),
    (["scaling", "--model", "resnet_tiny", "--devices", "1..100000"], "cannot simulate 32768, 65536, 100000"),   # 6336 nodes x 4
    (["validate"], "needs a measured sweep directory or --published"),
    (["validate", "--published", "nothing"], "expected one of horovod"),
    (["scaling", "--model", "resnet_tiny", "--devices", "1..3", "--global-batch", "16"],
     "cannot be split evenly over 3"),
    (["scaling", "--model", "resnet_tiny", "--simulate"], "--simulate needs --cluster"),
    (["scaling", "--model", "resnet_tiny", "--simulate", "--cluster", "no_cluster"],
     "cluster profile 'no_cluster' not found"),
    (["scaling", "--model", "resnet_tiny", "--devices", "1..512", "--simulate", "--cluster", "hpc_da"],
     "cannot simulate 256, 512"),
    (["scaling", "--model", "resnet_tiny", "--data", "imagenet"], "expected synthetic, jpeg, jpeg:DIR or tfds:NAME"),
    (["scaling", "--model", "resnet_tiny", "--simulate", "--cluster", "hpc_da", "--precision", "mixed_bfloat16"],
     "states no mixed_bfloat16 throughput"),
    (["scaling", "--model", "resnet_tiny", "--micro-batch", "0"], "expected a whole number >= 1"),
    (["scaling", "--model", "resnet_tiny", "--kill-rank-at", "10", "--steps", "10"], "choose 1..9"),
    (["scaling", "--model", "resnet_tiny", "--devices", "1", "--kill-rank-at", "2"], "at least 2 devices"),
    (["scaling", "--model", "resnet_tiny", "--kill-rank-at", "2", "--simulate", "--cluster", "hpc_da"],
     "not with --simulate"),
    (["train", "--benchmark", "no_such_benchmark"], "unknown benchmark"),
    (["train", "--benchmark", "mini_digits", "--framework", "keras", "-n", "2"], "--framework tnt"),
    (["plot", "/nonexistent/sweep"], "holds no runs.csv"),
    (["nonsense"], "invalid choice"),
])
def test_usage_errors(run_cli, argv, says, tmp_path):
    code, out, err = run_cli(*argv, *(["--out", str(tmp_path / "x")] if argv[0] == "scaling" else []))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("tnt-bench: error: ")
    assert says in lines[0]
