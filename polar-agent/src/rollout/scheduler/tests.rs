//! Scheduler unit tests.
