"""What a validation writes: the error per point, and the profile it was predicted with.

    validation.csv    one row per point: what was measured or published, what the
                      simulation predicted, the error, and the profile's sha256
    validation.json   the same points, the command, and the cluster profile's full
                      contents and sha256: a result cannot be re-predicted silently with
                      another profile (its hash would differ from the one recorded)
"""
from __future__ import annotations

import datetime
import json
import os

from bench.simulate.cluster_profile import ClusterProfile

__all__ = ["validation_points", "write_validation", "read_validation"]


def validation_points(measured: list[dict], predicted: list[dict]) -> list[dict]:
    """Error per measured count; the 1-device point is the calibration, the rest predictions."""
    by_count = {row["devices"]: row for row in predicted}
    points = []
    for real in sorted(measured, key=lambda r: r["devices"]):
        guess = by_count.get(real["devices"])
        if guess is None:
            continue
        points.append({"devices": real["devices"], "oversubscribed": real["oversubscribed"],
                       "role": "calibration" if real["devices"] == 1 else "prediction",
                       "measured_step_s": real["step_time_median_s"],
                       "predicted_step_s": guess["step_time_median_s"],
                       "relative_error": guess["step_time_median_s"] / real["step_time_median_s"] - 1.0,
                       "load_average_1m": real.get("load_average_1m")})
    return points


def write_validation(directory: str, points: list[dict], cluster: ClusterProfile, command: str,
                     extra: dict | None = None) -> list[str]:
    import pandas as pd
    os.makedirs(directory, exist_ok=True)
    rows = [{**point, "cluster": cluster.name, "cluster_sha256": cluster.sha256} for point in points]
    csv_path = os.path.join(directory, "validation.csv")
    pd.DataFrame(rows).to_csv(csv_path, index=False)
    record = {"created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": command, "cluster": cluster.describe(), "points": rows, **(extra or {})}
    json_path = os.path.join(directory, "validation.json")
    with open(json_path, "w", encoding="utf-8") as handle:
        json.dump(record, handle, indent=1, sort_keys=True, default=str)
        handle.write("\n")
    return [csv_path, json_path]


def read_validation(directory: str) -> dict:
    with open(os.path.join(directory, "validation.json"), encoding="utf-8") as handle:
        return json.load(handle)
