//! Tests of the evaluators against real commands: a [`host::HostRunner`]
//! runs each argv as a host process in a temporary workspace.

mod host;
