//! End-to-end tests of the rollout server with simulated gateways.
