//! The embedded defaults: the value of every key a file leaves out, and the
//! built-in routes used when the file has no `route` at all.

use std::net::Ipv4Addr;
use std::sync::Arc;

use super::cidr::Ipv4Cidr;
use super::host::{DnsName, HostPattern};
use super::route::{DEFAULT_PORTS, ProviderHint, Route, RouteAction};
use polar_inference::{BackendConfig, Dialect};

/// `agent.state_dir`.
pub const STATE_DIR: &str = "/var/lib/polar";
/// `proxy.max_body_bytes`: 32 MiB.
pub const MAX_BODY_BYTES: u64 = 32 * 1024 * 1024;
/// `sandbox.memory_bytes`: 8 GiB per sandbox that sets no memory limit.
/// (the gateway policy's default ceiling, which task specs get the same way).
pub const SANDBOX_MEMORY_BYTES: u64 = polar_spec::policy::DEFAULT_MAX_MEMORY_BYTES;
/// `sandbox.pids`: processes and threads of a sandbox that sets no limit.
pub const SANDBOX_PIDS: u32 = polar_spec::policy::DEFAULT_MAX_PIDS;
/// `sandbox.disk_bytes`: 2 GiB per sandbox.
pub const SANDBOX_DISK_BYTES: u64 = 2 << 30;
/// The smallest `sandbox.disk_bytes`: 16 MiB.
pub const MIN_SANDBOX_DISK_BYTES: u64 = 16 << 20;
/// `proxy.header_timeout_ms`: 10 s.
pub const HEADER_TIMEOUT_MS: u64 = 10_000;
/// `proxy.idle_timeout_ms`: 5 min (a model may think that long before its
/// first token).
pub const IDLE_TIMEOUT_MS: u64 = 300_000;
/// `proxy.max_connections`.
pub const MAX_CONNECTIONS: u32 = 4096;
/// `proxy.max_session_connections`.
pub const MAX_SESSION_CONNECTIONS: u32 = 256;
/// `proxy.max_session_streams`.
pub const MAX_SESSION_STREAMS: u32 = 256;
/// `proxy.max_session_body_bytes`: 256 MiB (eight bodies of the largest
/// size, gzip inflation included).
pub const MAX_SESSION_BODY_BYTES: u64 = 256 * 1024 * 1024;
/// `proxy.body_budget_bytes`: 1 GiB across all sessions.
pub const BODY_BUDGET_BYTES: u64 = 1024 * 1024 * 1024;
/// `proxy.admission_wait_ms`: 2 s.
pub const ADMISSION_WAIT_MS: u64 = 2_000;
/// `ca.validity_days`.
pub const CA_VALIDITY_DAYS: u32 = 365;
/// `ca.leaf_validity_hours`.
pub const LEAF_VALIDITY_HOURS: u32 = 24;
/// `ca.leaf_cache_size`.
pub const LEAF_CACHE_SIZE: u32 = 1024;
/// `dns.fake_range`: 127.100.0.0/16.
pub const FAKE_RANGE: Ipv4Cidr = match Ipv4Cidr::new(Ipv4Addr::new(127, 100, 0, 0), 16) {
    Some(range) => range,
    None => panic!("the default fake range is a valid CIDR"),
};
/// `dns.ttl_secs`.
pub const DNS_TTL_SECS: u32 = 60;
/// Port of the local inference server of the built-in backend.
pub const LOCAL_INFERENCE_PORT: u16 = 8000;
/// Name of the built-in backend.
pub const LOCAL_BACKEND: &str = "local";
/// Model name the built-in backend asks for (`vllm serve MODEL
/// --served-model-name default`).
pub const LOCAL_SERVED_MODEL: &str = "default";

/// The backends used when the file has no `backend` key: one vLLM server,
/// `local`, at `http://127.0.0.1:8000`, with the inference module's
/// defaults for everything else.
pub fn builtin_backends() -> Vec<BackendConfig> {
    vec![BackendConfig::new(
        LOCAL_BACKEND,
        Dialect::Vllm,
        vec![format!("http://127.0.0.1:{LOCAL_INFERENCE_PORT}")],
        LOCAL_SERVED_MODEL,
    )]
}

/// The model API hosts of the harnesses Polar knows, with their protocol.
///
/// DashScope is listed by name (mainland and international endpoints), not
/// as `*.aliyuncs.com`: that suffix also covers Alibaba Cloud storage and
/// the telemetry host Qwen Code calls, which are not model APIs.
pub const BUILTIN_MODEL_HOSTS: [(&str, ProviderHint); 5] = [
    ("api.anthropic.com", ProviderHint::Anthropic),
    ("api.openai.com", ProviderHint::Auto),
    ("generativelanguage.googleapis.com", ProviderHint::Gemini),
    ("dashscope.aliyuncs.com", ProviderHint::OpenAi),
    ("dashscope-intl.aliyuncs.com", ProviderHint::OpenAi),
];

/// The routes used when the file has no `route` key: each built-in model
/// host on ports 443 and 80 to `backend` (the first configured backend).
pub fn builtin_routes(backend: &str) -> Vec<Route> {
    let backend: Arc<str> = Arc::from(backend);
    BUILTIN_MODEL_HOSTS
        .iter()
        .map(|(host, provider)| Route {
            name: None,
            host: HostPattern::Exact(DnsName::from_static(host)),
            ports: DEFAULT_PORTS.to_vec(),
            action: RouteAction::Model {
                provider: *provider,
                backend: Some(Arc::clone(&backend)),
                upstream: None,
            },
            addresses: Vec::new(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_hosts_are_valid_patterns() {
        for (host, _) in BUILTIN_MODEL_HOSTS {
            assert_eq!(
                HostPattern::parse(host),
                Ok(HostPattern::Exact(DnsName::from_static(host)))
            );
        }
        assert_eq!(builtin_routes("local").len(), BUILTIN_MODEL_HOSTS.len());
    }

    #[test]
    fn builtin_backend_is_the_local_server() {
        let b = builtin_backends();
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].name, LOCAL_BACKEND);
        assert_eq!(b[0].replicas, ["http://127.0.0.1:8000"]);
        assert!(b[0].validate().is_ok());
    }
}
