from tarantella.keras.overlap import communication_profile


def test_buckets_reduced_during_backprop_are_hidden():
    # bucket 0 reduced while backprop continues; bucket 1 (the last) after it ended at t=10.
    profile = communication_profile([(2.0, 2.0, 5.0), (10.0, 10.0, 12.0)])
    assert profile["communication_s"] == 5.0
    assert profile["hidden_s"] == 3.0
    assert profile["exposed_s"] == 2.0
    assert profile["hidden_fraction"] == 3.0 / 5.0


def test_communication_after_backprop_is_exposed():
    profile = communication_profile([(10.0, 10.0, 11.0), (10.0, 11.0, 13.0)])
    assert profile["hidden_s"] == 0.0 and profile["exposed_s"] == 3.0


def test_a_bucket_straddling_the_end_of_backprop_counts_partly():
    profile = communication_profile([(1.0, 4.0, 8.0), (6.0, 8.0, 9.0)])
    assert profile["hidden_s"] == 2.0 and profile["exposed_s"] == 3.0


def test_no_buckets():
    assert communication_profile([])["buckets"] == 0
