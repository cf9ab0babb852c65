"""A coordinate-wise median as an aggregation stage: robust to a few outlying updates at any site."""

import torch

import fedge
from fedge.aggregation import Reducer, Updates


class CoordinateMedian(Reducer):
    """Each output takes, coordinate by coordinate, the median of the rows it gives a positive weight."""

    def reduce(self, updates: Updates) -> dict[str, torch.Tensor]:
        part = updates.joined()  # every row the site received, with each output's weights on them
        weights = part.weights if updates.per_receiver else part.weights.unsqueeze(0)
        out = {}
        for name, rows in part.rows.items():
            if not rows.is_floating_point():
                continue  # integer counters keep the site's own value
            medians = [rows[w > 0].median(dim=0).values for w in weights]
            out[name] = torch.stack(medians) if updates.per_receiver else medians[0]
        return out


fedge.register_stage("my_median", CoordinateMedian)
