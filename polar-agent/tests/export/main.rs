//! Export integration tests: a sample rollout written as captured session
//! logs, exported with `polar export` to a local directory and to an
//! S3-compatible server (moto, started on loopback), read back and compared
//! with trajectories rebuilt from the records, and read by the dashboard
//! beneath its `s3_roots` (`dashboard_s3`); and the Parquet output
//! loaded with pyarrow and Hugging Face `datasets`. The Python packages are
//! installed from PyPI when missing; if that fails the tests fail, saying
//! why (they are never skipped).

mod fixture;
mod moto;
mod python;

mod dashboard_s3;
mod datasets;
mod local;
mod s3;
