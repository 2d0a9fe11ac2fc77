//! The `polar` binary.

fn main() -> std::process::ExitCode {
    polar_agent::cli::main()
}
