"""The optimizer set-ups the sharding test programs train with (sharded_optimizer.py, sharded_weights.py): each a
function making a new optimizer, by the name the programs print."""
import keras


def adamw_without_bias_decay():
    optimizer = keras.optimizers.AdamW(0.01, weight_decay=0.05)
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
    return optimizer


SET_UPS = {
    "SGD with momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
    "AdamW excluding biases from decay": adamw_without_bias_decay,
    "Adam with global_clipnorm": lambda: keras.optimizers.Adam(0.01, global_clipnorm=0.05),
    "RMSprop with a schedule and EMA": lambda: keras.optimizers.RMSprop(
        keras.optimizers.schedules.ExponentialDecay(0.01, 2, 0.5), use_ema=True, ema_overwrite_frequency=3),
}
