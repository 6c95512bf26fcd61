"""One-process checks of ZeRO stage 1's pieces: who owns what (Note [Whole variables to owners, balanced by
bytes]), the shard setting, and the one-line refusals."""
import keras
import pytest

from tarantella import config
from tarantella.sharding import owners, update


def test_owners_balance_bytes_largest_first_and_every_rank_gets_a_share():
    sizes = [400, 4, 300, 3, 300, 100]
    assert owners.assign_owners(sizes, 1) == [0] * 6
    two = owners.assign_owners(sizes, 2)
    loads = [sum(s for s, o in zip(sizes, two) if o == r) for r in range(2)]
    assert two[0] != two[2] and abs(loads[0] - loads[1]) <= 100, (two, loads)
    four = owners.assign_owners(sizes, 4)
    assert set(four) == {0, 1, 2, 3}
    assert four == owners.assign_owners(sizes, 4), "every rank must draw the same assignment"
    assert owners.assign_owners([8, 8, 8], 3) == [0, 1, 2], "ties go to the lowest rank, in model order"
    assert "largest share 1.00" in owners.describe([8, 8], [0, 1], 2)
    with pytest.raises(ValueError):
        owners.assign_owners([1], 0)


def test_the_shard_setting_is_one_table_entry_and_bad_values_name_the_fix(monkeypatch):
    assert config.load_config({}).shard == ""
    assert config.load_config({"TNT_SHARD": "Optimizer"}).shard == "optimizer"
    assert config.load_config({"TNT_SHARD": "off"}).shard == ""
    with pytest.raises(config.ConfigError, match="TNT_SHARD='stage1'.*--shard"):
        config.load_config({"TNT_SHARD": "stage1"})
    assert update.resolve_mode("optimizer") == "optimizer"
    assert update.resolve_mode(False) is None and update.resolve_mode("off") is None
    with pytest.raises(ValueError, match="not a sharding mode"):
        update.resolve_mode("zero1")
    assert update.resolve_mode("Gradients".lower()) == "gradients"
    assert config.load_config({"TNT_SHARD": "gradients"}).shard == "gradients"
    assert update.resolve_mode("weights") == "weights"
    assert config.load_config({"TNT_SHARD": "weights"}).shard == "weights"
    with pytest.raises(ValueError, match=r"sharded by tnt.shard_weights\(model\)"):  # weights held whole
        update._holders([keras.Variable(keras.ops.zeros(3))])
    monkeypatch.setenv("TNT_SHARD", "optimizer")
    from tarantella import runtime
    monkeypatch.setattr(runtime, "settings", lambda: config.load_config())
    assert update.resolve_mode(None) == "optimizer"


def _variables(count):
    return [keras.Variable(keras.ops.zeros((3,)), name=f"v{i}") for i in range(count)]


def test_optimizers_that_cannot_be_sharded_are_refused_in_one_line():
    variables = _variables(3)
    with pytest.raises(TypeError, match="shards a Keras optimizer"):
        update._check_shardable(object(), variables, 2)
    with pytest.raises(ValueError, match="global_clipnorm with gradient_accumulation_steps in SGD"):
        update._check_shardable(keras.optimizers.SGD(global_clipnorm=1.0, gradient_accumulation_steps=2),
                                variables, 2)
    with pytest.raises(ValueError, match="shard='gradients' gives every rank .* 3 trainable variables for 4 ranks"):
        update._check_shardable(keras.optimizers.Adam(), variables, 4, "gradients")
    built = keras.optimizers.Adam()
    built.build(variables)
    with pytest.raises(ValueError, match="already built"):
        update._check_shardable(built, variables, 2)
    update._check_shardable(keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(global_clipnorm=1.0)),
                            variables, 3)


def test_the_global_clip_factor_is_kerass_own():
    """Clipping with the factor computed over all gradients gives the bits of Keras's clip_by_global_norm."""
    gradients = [keras.ops.convert_to_tensor([[3.0, -4.0], [1e-3, 2.5]]), keras.ops.convert_to_tensor([0.7, -0.2])]
    factor = update._global_clip_factor([update._squared_sum(g) for g in gradients], 0.5)
    from keras.src.optimizers.base_optimizer import clip_by_global_norm  # Keras's own, for the comparison only
    for ours, keras_s in zip([g * factor for g in gradients], clip_by_global_norm(gradients, 0.5)):
        assert keras.ops.all(keras.ops.equal(ours, keras_s))


def test_a_sharded_optimizer_refuses_variables_it_was_not_built_on():
    import tarantella as tnt

    built_on, other = _variables(2), _variables(1)
    optimizer = tnt.shard_optimizer(keras.optimizers.SGD(0.1), built_on)
    optimizer.apply([keras.ops.ones((3,))] * 2, built_on)  # one rank: it owns both, and updates them
    assert float(built_on[0].numpy()[0]) == pytest.approx(-0.1) and int(optimizer.iterations.numpy()) == 1
    with pytest.raises(ValueError, match="was built on other variables than"):
        optimizer.apply([keras.ops.ones((3,))], other)


def test_a_variable_goes_in_parts_across_nodes_from_3_ranks_when_large_and_above_a_fair_share():
    from tarantella.sharding.spread_transfers import SpreadTransfers
    kib = 1024

    def across_nodes(transfers):   # this test runs on one node: as the ranks would see it across several
        transfers.across_nodes = True
        return transfers

    assert SpreadTransfers(0, 4, None, "test").parts((1 << 20,), "float32") is None   # one node: never
    alone = across_nodes(SpreadTransfers(0, 4, None, "test"))            # a layer's gather: size alone decides
    assert alone.parts((256 * kib // 4,), "float32") == [21846, 21845, 21845]   # 3 holders, near-equal parts
    assert alone.parts((256 * kib // 4 - 1,), "float32") is None       # below --shard-spread (256 KiB)
    assert across_nodes(SpreadTransfers(0, 2, None, "test")).parts((1 << 20,), "float32") is None   # one hop
    together = across_nodes(SpreadTransfers(0, 4, None, "test", total_bytes=16 << 20))   # fair share 4 MiB
    assert together.parts((1 << 20,), "float32") is None               # 4 MiB: not above it
    assert together.parts((1 << 20, 2), "float32") == [699051, 699051, 699050]
