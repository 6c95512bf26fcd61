"""Published scaling curves drawn beside a simulation of the same cluster (issue 41 §3).

The points are the original Tarantella's (tarantella_published.toml, with their source): a user reads the
simulated curve next to what the system measured. Speedup of a published point = the curve's 1-device
minutes per epoch over its own.
"""
from __future__ import annotations

import dataclasses
import os
import tomllib

from bench.simulate.cluster_profile import same_profile_name

__all__ = ["PublishedCurve", "published_curves", "curves_for"]

_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tarantella_published.toml")


@dataclasses.dataclass(frozen=True)
class PublishedCurve:
    cluster: str
    model: str
    shown_with: tuple[str, ...]
    label: str
    source: str
    devices: tuple[int, ...]
    minutes_per_epoch: tuple[float, ...]

    @property
    def speedups(self) -> tuple[float, ...]:
        one = self.minutes_per_epoch[self.devices.index(1)]
        return tuple(one / minutes for minutes in self.minutes_per_epoch)

    def describe(self) -> dict:
        return {"cluster": self.cluster, "model": self.model, "label": self.label, "source": self.source,
                "devices": list(self.devices), "minutes_per_epoch": list(self.minutes_per_epoch),
                "speedup": [round(s, 3) for s in self.speedups]}


def published_curves(path: str = _FILE) -> list[PublishedCurve]:
    with open(path, "rb") as handle:
        data = tomllib.load(handle)
    curves = []
    for curve in data["curve"]:
        devices, minutes = tuple(curve["devices"]), tuple(float(m) for m in curve["minutes_per_epoch"])
        assert len(devices) == len(minutes) and 1 in devices, f"{path}: {curve['label']}"
        curves.append(PublishedCurve(curve["cluster"], curve["model"], tuple(curve["shown_with"]),
                                     curve["label"], data["source"], devices, minutes))
    return curves


def curves_for(model: str, cluster: str) -> list[PublishedCurve]:
    """The published curves to draw beside a simulated series of `model` on `cluster` (a profile's name)."""
    return [curve for curve in published_curves()
            if model in curve.shown_with and same_profile_name(curve.cluster, cluster)]
