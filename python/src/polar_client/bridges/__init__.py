"""Adapters between Polar and RL trainers. Each module imports its trainer
when imported itself; the package's core never does.

- ``polar_client.bridges.verl``: an agent loop for verl (tested against
  verl 0.9.1, see docs/TRAINERS.md);
- ``polar_client.bridges.skyrl``: a generator for SkyRL (skyrl-train 0.3.1);
- ``polar_client.bridges.nemo_gym``: an agent server for NeMo Gym (nemo-gym 0.4.0);
- ``polar_client.bridges.slime``: a rollout function for slime (checked by
  hand against its repository: slime is on no registry reached here).
"""
