//! Library target of the eBPF crate: it exists so that `polar-agent` can
//! name this crate as a build-dependency (cargo then rebuilds the agent when
//! the programs change); the programs themselves are the `polar-ebpf` binary.
#![forbid(unsafe_code)]
#![no_std]
