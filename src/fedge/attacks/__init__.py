"""What a run actually leaks: attacks on the transfers a run recorded and on its final model.

Each attack states its paper, its threat model (who attacks, what they see, what they know) and its
success metric. The attack functions work on tensors and models; :mod:`fedge.attacks.from_run` binds
them to a run directory's recorded transfers (``output.record``) and ``fedge attack`` runs them.
"""
