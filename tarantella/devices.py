"""Which device each rank computes on.

Where GPUs exist, each rank sees exactly one: the one at its local rank
(wrapping around when a node runs more ranks than it has GPUs), with memory
growth on, so ranks sharing a node do not grab each other's memory. With
--no-gpu (TNT_NO_GPU=1) no rank sees a GPU. Without GPUs nothing changes.

This is applied through the environment (CUDA_VISIBLE_DEVICES,
TF_FORCE_GPU_ALLOW_GROWTH) when tarantella is imported before TensorFlow,
which needs no TensorFlow import; if TensorFlow was imported first,
`configure_tensorflow` does the same through tf.config, as long as
TensorFlow has not initialised its devices yet.
"""
from __future__ import annotations

import logging
import os
import re
from typing import Mapping, MutableMapping, Sequence

from tarantella import config

__all__ = ["local_rank", "detected_gpus", "gpu_for_rank", "environment_for_rank", "configure_environment",
           "configure_tensorflow"]

logger = logging.getLogger("tarantella")
HIDE_ALL = "-1"
_LOCAL_RANK_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK", "SLURM_LOCALID")


def local_rank(environ: Mapping[str, str]) -> int | None:
    """This process's rank among the ranks on its node, if a launcher said so."""
    for name in _LOCAL_RANK_VARIABLES:
        if environ.get(name, "").strip().isdigit():
            return int(environ[name])
    return None


def detected_gpus(environ: Mapping[str, str], driver_dir: str = "/proc/driver/nvidia/gpus") -> list[str]:
    """The GPU ids a process may use: CUDA_VISIBLE_DEVICES if set, else those the driver lists."""
    if "CUDA_VISIBLE_DEVICES" in environ:
        ids = [part.strip() for part in environ["CUDA_VISIBLE_DEVICES"].split(",") if part.strip()]
        return [] if ids and ids[0].startswith("-") else ids
    try:
        devices = [d for d in os.listdir(driver_dir) if re.match(r"^[0-9a-f:.]+$", d)]
        return [str(index) for index in range(len(devices))]
    except OSError:
        return []


def gpu_for_rank(gpus: Sequence[str], local_rank_: int) -> str:
    return gpus[local_rank_ % len(gpus)]


def environment_for_rank(environ: Mapping[str, str], gpus: Sequence[str], no_gpu: bool) -> dict[str, str]:
    """The variables to set so that this rank sees its GPU only (or none); empty: leave all as is."""
    if no_gpu:
        return {"CUDA_VISIBLE_DEVICES": HIDE_ALL}
    rank = local_rank(environ)
    if not gpus or rank is None:
        return {}
    return {"CUDA_VISIBLE_DEVICES": gpu_for_rank(gpus, rank), "TF_FORCE_GPU_ALLOW_GROWTH": "true"}


def configure_environment(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    no_gpu = config.load_config(environ).no_gpu
    changes = environment_for_rank(environ, detected_gpus(environ), no_gpu)
    environ.update(changes)
    return changes


def configure_tensorflow(tf) -> None:
    """The tf.config route, for when TensorFlow was imported before tarantella."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return
    rank = local_rank(os.environ)
    no_gpu = config.load_config().no_gpu
    if rank is None and not no_gpu:
        return
    try:
        visible = [] if no_gpu else [gpus[rank % len(gpus)]]
        tf.config.set_visible_devices(visible, "GPU")
        for gpu in visible:
            tf.config.experimental.set_memory_growth(gpu, True)
    except RuntimeError as error:
        logger.warning("tarantella: could not give local rank %s its own GPU (%s); import tarantella before "
                       "TensorFlow, or set CUDA_VISIBLE_DEVICES per rank", rank, error)
