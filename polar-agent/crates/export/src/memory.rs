//! Allocator tuning for a process that exports. Export allocates and frees
//! tens of megabytes per session (Arrow arrays, encoded pages, output
//! buffers); with glibc's default thresholds every cycle hands the memory
//! back to the kernel and faults it in again, which costs about as much CPU
//! as the Parquet encoding itself (measured in BENCHMARKS.md). Keeping
//! freed memory for reuse removes that; resident memory then stays at the
//! peak of one session instead of falling between sessions.
//!
//! Process-wide, so only processes that mostly export call it (`polar
//! export`, the export benchmark), not the agent.

/// Largest allocation served from the heap rather than its own mapping
/// (glibc's maximum for this parameter on 64-bit).
const MMAP_THRESHOLD: i32 = 32 << 20;
/// Free memory at the top of the heap kept before trimming.
const TRIM_THRESHOLD: i32 = 256 << 20;

/// Tells the allocator to keep freed memory for reuse. Returns whether the
/// allocator accepted (always false off glibc, where nothing is changed).
pub fn retain_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets glibc malloc parameters, under the
        // allocator's own lock; both values are in the documented ranges.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        let _ = (MMAP_THRESHOLD, TRIM_THRESHOLD);
        false
    }
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn glibc_accepts_the_thresholds() {
        assert!(super::retain_freed_memory());
    }
}
