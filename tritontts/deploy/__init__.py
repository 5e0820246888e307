"""Deployment over the registry: the stage and ensemble repository (generated ensembles,
served checkpoints), hardware profiles, and the tritonserver launcher."""
