"""`--data jpeg` (issue 41 §2): the generated ImageNet-like set, MLPerf's input pipeline with each rank reading its
own files, and a sweep that says whether each measured run was input-bound."""
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from bench.data import imagenet_like, jpeg_pipeline
from bench.errors import BenchUsageError
from bench.input_bound import INPUT_BOUND_SHARE, input_fields

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def small_set(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("imagenet_like"))
    return directory, imagenet_like.generate(directory, images=24, files=4, seed=3)


def test_image_sizes_follow_the_stated_distribution():
    rng = np.random.default_rng(0)
    sizes = [imagenet_like.image_size_of(rng) for _ in range(20000)]
    long_sides = np.array([max(size) for size in sizes])
    assert abs(np.mean(long_sides == 500) - 0.8) < 0.02          # most at the 500 px "medium" size
    oblong = [(h, w) for h, w in sizes if h != w]
    assert abs(np.mean([w > h for h, w in oblong]) - 0.75) < 0.02     # landscape
    assert abs(1 - len(oblong) / len(sizes) - 0.10) < 0.01              # squares
    assert np.median([h * w for h, w in sizes]) == 500 * 375       # ImageNet's median image


def test_the_generated_set_has_imagenets_bytes_per_image_and_is_made_once(small_set):
    directory, description = small_set
    assert 0.6 < description["mean_bytes"] / imagenet_like.IMAGENET_MEAN_BYTES < 1.4, description
    assert 85 <= description["mean_quality"] <= 95
    assert imagenet_like.describe(directory) == description
    files = jpeg_pipeline.train_files(directory)
    assert len(files) == 4 and not any(name.endswith(".tmp") for name in os.listdir(directory))
    stamps = [os.path.getmtime(path) for path in files]
    assert imagenet_like.ensure_set(directory)[1] == description        # reused, not made again
    assert [os.path.getmtime(path) for path in files] == stamps


def test_each_rank_reads_its_own_files():
    files = [f"train-{i:05d}" for i in range(10)]
    shares = [jpeg_pipeline.files_of_rank(files, rank, 4) for rank in range(4)]
    assert sorted(sum(shares, [])) == files and all(shares)
    assert not set(shares[0]) & set(shares[1])
    with pytest.raises(BenchUsageError, match="at least one file per rank"):
        jpeg_pipeline.files_of_rank(files[:3], 0, 4)
    with pytest.raises(BenchUsageError, match="no TFRecord files"):
        jpeg_pipeline.train_files(REPO)


@pytest.mark.parametrize("channels", [3, 1])
def test_the_pipeline_yields_normalised_random_crops_at_the_models_size(small_set, channels):
    files = jpeg_pipeline.train_files(small_set[0])
    images, labels = next(iter(jpeg_pipeline.rank_dataset(files, 1, 2, 4, 16, channels, num_classes=10, seed=0)))
    assert images.shape == (4, 16, 16, channels) and images.dtype.name == "float32"
    assert labels.dtype.name == "int32" and ((labels.numpy() >= 0) & (labels.numpy() < 10)).all()
    if channels == 3:
        assert abs(float(np.mean(images))) < 2.0 and 0.05 < float(np.std(images)) < 3.0


def test_sharding_after_the_decode_keeps_one_of_k_micro_batches_of_every_file(small_set):
    """Note [Sharding after the decode]: ranks 0 and 1 of 2 read the same decoded stream, alternate
    micro-batches each; the labels say which images a micro-batch holds."""
    files = jpeg_pipeline.train_files(small_set[0])
    whole = jpeg_pipeline.rank_dataset(files, 0, 1, 2, 16, 3, num_classes=1000, seed=0, decoded_ranks=1)
    shares = [jpeg_pipeline.rank_dataset(files, rank, 2, 2, 16, 3, num_classes=1000, seed=0, decoded_ranks=2)
              for rank in range(2)]
    stream = [labels.numpy().tolist() for _, labels in whole.take(4)]
    kept = [[labels.numpy().tolist() for _, labels in share.take(2)] for share in shares]
    assert kept == [stream[0::2], stream[1::2]]


def test_the_input_bound_verdict_is_the_stated_share():
    assert input_fields(None, 1.0) == {}
    assert input_fields(0.6, 1.0)["bound_by"] == "input" and INPUT_BOUND_SHARE == 0.5
    assert input_fields(0.2, 1.0) == {"input_alone_s": 0.2, "input_share": 0.2, "bound_by": "compute"}


@pytest.mark.parametrize("argv, message", [
    (["--model", "transformer_tiny", "--data", "jpeg"], "feeds image models"),
    (["--model", "resnet_tiny", "--data", "jpeg:/no/such/dir"], "no such directory"),
    (["--model", "resnet_tiny", "--input-sharding", "after-decode"], "needs --data jpeg"),
])
def test_bad_data_is_one_line(run_cli, argv, message):
    code, _, err = run_cli("scaling", "--devices", "1", *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.multirank
@pytest.mark.timeout(240)
def test_a_jpeg_sweep_reads_per_rank_files_and_says_what_bound_each_run(small_set, tmp_path):
    out = tmp_path / "sweep"
    done = subprocess.run([sys.executable, "-m", "bench", "scaling", "--model", "resnet_tiny", "--devices", "2",
                           "--data", f"jpeg:{small_set[0]}", "--steps", "3", "--warmup-steps", "1", "--no-plots",
                           "--out", str(out)], capture_output=True, text=True, timeout=220, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = pd.read_csv(out / "runs.csv")
    measured = runs[~runs["simulated"]]
    assert list(measured["devices"]) == [2]
    assert set(measured["bound_by"]) <= {"input", "compute"} and (measured["input_alone_s"] > 0).all()
    assert (measured["input_share"] == measured["input_alone_s"] / measured["step_time_median_s"]).all()
    assert "bound by" in done.stdout and "of a step)" in done.stdout
