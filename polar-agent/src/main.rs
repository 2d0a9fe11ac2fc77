//! The `polar` binary.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    polar_agent::cli::main()
}
