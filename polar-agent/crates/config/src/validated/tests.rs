//! Tests of [`Config`]: the empty file and the example file, and the errors
//! of whole documents with their key paths and locations.

use std::path::PathBuf;
use std::time::Duration;

use super::*;
use crate::error::Location;
use crate::route::{DefaultAction, ProviderHint};
use crate::sections::LogFormat;

const EXAMPLE: &str = include_str!("../../../../../config/polar.example.toml");

fn config(text: &str) -> Config {
    match Config::from_toml_str(text) {
        Ok(config) => config,
        Err(error) => panic!("should be valid: {error}\n{text}"),
    }
}

fn error(text: &str) -> ConfigError {
    match Config::from_toml_str(text) {
        Ok(config) => panic!("should be refused: {text}\n{config:?}"),
        Err(error) => error,
    }
}

#[test]
fn empty_file_is_the_default() {
    let empty = config("");
    assert_eq!(empty, Config::default());
    assert_eq!(empty.route_source, RouteSource::BuiltIn);
    assert_eq!(empty.agent.state_dir, PathBuf::from("/var/lib/polar"));
    assert_eq!(empty.agent.log_format, LogFormat::Text);
    assert_eq!(empty.proxy.max_body_bytes, 32 * 1024 * 1024);
    assert_eq!(empty.proxy.header_timeout, Duration::from_secs(10));
    assert_eq!(empty.proxy.base_url_listen, None);
    assert_eq!(empty.ca.validity_days, 365);
    assert_eq!(empty.ca.leaf_validity_hours, 24);
    assert_eq!(empty.ca.leaf_cache_size, 1024);
    assert_eq!(empty.dns.fake_range.to_string(), "127.100.0.0/16");
    assert_eq!(empty.rules.default_action(), DefaultAction::Deny);
    assert_eq!(config("# nothing\n\n"), Config::default());
}

#[test]
fn builtin_routes_intercept_the_model_apis() {
    let rules = Config::default().rules;
    for (host, provider) in [
        ("api.anthropic.com", ProviderHint::Anthropic),
        ("api.openai.com", ProviderHint::Auto),
        ("generativelanguage.googleapis.com", ProviderHint::Gemini),
        ("dashscope.aliyuncs.com", ProviderHint::OpenAi),
        ("dashscope-intl.aliyuncs.com", ProviderHint::OpenAi),
    ] {
        for port in [443, 80] {
            let decision = rules.route(Some(host), None, port);
            let RouteAction::Model {
                provider: hint,
                backend,
                upstream,
            } = &decision.action
            else {
                panic!("{host}:{port} should be a model route: {decision:?}");
            };
            assert_eq!(*hint, provider, "{host}");
            assert_eq!(backend.as_deref(), Some("local"));
            assert_eq!(*upstream, None);
        }
    }
    // Qwen Code's telemetry on another aliyuncs.com host is not a model API.
    let other = rules.route(Some("gm.mmstat.aliyuncs.com"), None, 443);
    assert_eq!(other.action, RouteAction::Deny);
    assert_eq!(rules.intercepted_hosts().len(), 5);
}

#[test]
fn example_file_is_valid_and_documents_the_defaults() {
    let example = config(EXAMPLE);
    let default = Config::default();
    assert_eq!(example.route_source, RouteSource::File);
    assert_eq!(
        Config {
            route_source: RouteSource::BuiltIn,
            ..example
        },
        default
    );
}

#[test]
fn example_file_loads_from_disk() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../config/polar.example.toml");
    assert!(Config::load(&path).is_ok());
}

/// `key = value` with a bare lower-case key.
fn is_assignment(line: &str) -> bool {
    line.split_once(" = ").is_some_and(|(key, _)| {
        !key.is_empty() && key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
    })
}

#[test]
fn commented_out_examples_in_the_example_file_are_valid() {
    // Uncomment every "# key = value" line and "# [[route]]", "# [[backend]]",
    // "# [backend.sampling]" and "# [gateway]" header (the gateway table is
    // checked by gateway::config's own test of this file).
    let uncommented: String = EXAMPLE
        .lines()
        .map(|line| match line.strip_prefix("# ") {
            Some(rest)
                if rest.starts_with("[[route]]")
                    || rest.starts_with("[[backend]]")
                    || rest.starts_with("[backend.")
                    || rest.starts_with("[gateway]")
                    || rest.starts_with("[harness.")
                    || is_assignment(rest) =>
            {
                rest
            }
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let config = config(&uncommented);
    assert!(config.proxy.base_url_listen.is_some());
    assert_eq!(config.rules.routes().len(), 7);
    assert_eq!(config.backends.len(), 2);
    assert_eq!(config.backends[1].max_tokens_clamp, Some(8192));
    assert_eq!(config.harnesses["pi-chat"].command[0], "pi");
}

#[test]
fn route_list_replaces_the_builtins() {
    let custom = config(
        "default_action = \"pass\"\n\
         [[route]]\nhost = \"*.example.com\"\naction = \"deny\"\nname = \"block\"\n",
    );
    assert_eq!(custom.route_source, RouteSource::File);
    assert_eq!(custom.rules.routes().len(), 1);
    assert_eq!(
        custom
            .rules
            .route(Some("api.anthropic.com"), None, 443)
            .action,
        RouteAction::Pass
    );
    let none = config("route = []\n");
    assert!(none.rules.routes().is_empty());
    assert_eq!(none.route_source, RouteSource::File);
}

#[test]
fn unknown_field_names_its_table_and_line() {
    let error =
        error("[[route]]\nhost = \"a.example\"\naction = \"pass\"\n[[route]]\nhots = \"b\"\n");
    assert!(
        error
            .to_string()
            .starts_with("unknown field `hots` at route[1], expected one of `host`, "),
        "{error}"
    );
    assert_eq!(error.location(), Some(Location { line: 5, column: 1 }));
    let top = self::error("[proxy]\nmax_body_bytes = 2048\n[bogus]\n");
    assert!(
        top.to_string()
            .starts_with("unknown field `bogus` at top level"),
        "{top}"
    );
}

#[test]
fn schema_errors_name_the_key() {
    let bad_action = error("[[route]]\nhost = \"a\"\naction = \"modle\"\n");
    assert_eq!(
        bad_action.to_string(),
        "route[0].action: unknown variant `modle`, expected one of `model`, `pass`, `deny` (line 3, column 10)"
    );
    let bad_provider =
        error("[[route]]\nhost = \"a\"\naction = \"model\"\nprovider = \"openai-chat\"\n");
    assert!(
        bad_provider
            .to_string()
            .starts_with("route[0].provider: unknown variant")
    );
    let missing = error("[[route]]\nhost = \"a\"\naction = \"pass\"\n[[route]]\nhost = \"b\"\n");
    assert_eq!(
        missing.to_string(),
        "route[1]: missing field `action` (line 4, column 1)"
    );
    let port = error("[[route]]\nhost = \"a\"\naction = \"pass\"\nports = [443, 65536]\n");
    assert!(
        port.to_string()
            .starts_with("route[0].ports[1]: invalid value"),
        "{port}"
    );
    let wrong_type = error("[ca]\nvalidity_days = \"1y\"\n");
    assert!(
        wrong_type
            .to_string()
            .starts_with("ca.validity_days: invalid type"),
        "{wrong_type}"
    );
    let inline = error("route = [{ host = \"a\", action = \"pass\", port = 1 }]\n");
    assert!(
        inline
            .to_string()
            .starts_with("unknown field `port` at route[0]"),
        "{inline}"
    );
}

#[test]
fn validation_errors_name_the_key_and_line() {
    let text = "[[route]]\nhost = \"a.example\"\naction = \"pass\"\n\
                [[route]]\nhost = \"b.example\"\naction = \"pass\"\n\
                [[route]]\nhost = \"*.\"\naction = \"deny\"\n";
    assert_eq!(
        error(text).to_string(),
        "route[2].host: \"*.\" is not a valid host pattern: nothing follows \"*.\" (line 8, column 8)"
    );
    // A missing key points at its table.
    let missing = error(
        "backend = []\n[ca]\nleaf_cache_size = 5\n[[route]]\nhost = \"a.example\"\naction = \"model\"\n",
    );
    assert_eq!(missing.location(), Some(Location { line: 4, column: 1 }));
    assert!(
        missing
            .to_string()
            .starts_with("route[0].backend: a model route needs")
    );
    let range = error("[dns]\nfake_range = \"10.0.0.0/8\"\n");
    assert_eq!(
        range.location(),
        Some(Location {
            line: 2,
            column: 14
        })
    );
}

#[test]
fn syntax_errors_have_a_location() {
    let error = error("default_action = \"deny\"\n[proxy\n");
    assert!(
        matches!(
            error,
            ConfigError::Syntax {
                at: Location { line: 2, .. },
                ..
            }
        ),
        "{error}"
    );
    let duplicate = self::error("[proxy]\nmax_connections = 1\nmax_connections = 2\n");
    assert!(
        matches!(
            duplicate,
            ConfigError::Syntax {
                at: Location { line: 3, .. },
                ..
            }
        ),
        "{duplicate}"
    );
}

#[test]
fn addresses_are_checked_across_sections() {
    let fake_upstream = "[[route]]\nhost = \"a.example\"\naction = \"model\"\nupstream = \"http://127.100.0.9:8000\"\n";
    assert!(
        error(fake_upstream)
            .to_string()
            .starts_with("route[0].upstream: ")
    );
    let fake_host = "[[route]]\nhost = \"127.100.1.1\"\naction = \"pass\"\n";
    assert!(error(fake_host).to_string().starts_with("route[0].host: "));
    let fake_listen = "[proxy]\nbase_url_listen = \"127.100.0.1:8787\"\n";
    assert!(
        error(fake_listen)
            .to_string()
            .starts_with("proxy.base_url_listen: ")
    );
    // The built-in backend is at 127.0.0.1:8000: listening there loops.
    let looped = error("[proxy]\nbase_url_listen = \"0.0.0.0:8000\"\n");
    assert!(
        looped.to_string().starts_with("backend[0].replicas[0]: "),
        "{looped}"
    );
    let looped = error(
        "[proxy]\nbase_url_listen = \"0.0.0.0:8000\"\n[[backend]]\nname = \"b\"\ndialect = \"vllm\"\n\
         served_model = \"m\"\nreplicas = [\"http://10.0.0.2:8000\"]\n\
         [[route]]\nhost = \"a.example\"\naction = \"model\"\nupstream = \"http://127.0.0.1:8000\"\n",
    );
    assert!(
        looped.to_string().starts_with("route[0].upstream: "),
        "{looped}"
    );
    let fake_replica = error(
        "[[backend]]\nname = \"b\"\ndialect = \"vllm\"\nserved_model = \"m\"\nreplicas = [\"http://127.100.0.3:8000\"]\n",
    );
    assert!(
        fake_replica
            .to_string()
            .starts_with("backend[0].replicas[0]: "),
        "{fake_replica}"
    );
    let moved = "backend = []\n[proxy]\nbase_url_listen = \"0.0.0.0:8000\"\n[dns]\nfake_range = \"198.18.0.0/15\"\n\
                 [[route]]\nhost = \"a.example\"\naction = \"model\"\nupstream = \"http://10.0.0.2:8000\"\n";
    assert!(Config::from_toml_str(moved).is_ok());
}

#[test]
fn load_names_the_file() {
    let missing = Config::load("/nonexistent/polar.toml");
    assert!(matches!(missing, Err(ConfigError::Read { .. })));
    let dir = std::env::temp_dir().join(format!("polar-config-test-{}", std::process::id()));
    assert!(std::fs::create_dir_all(&dir).is_ok());
    let file = dir.join("bad.toml");
    assert!(std::fs::write(&file, "[ca]\nvalidity_days = 0\n").is_ok());
    let Err(error) = Config::load(&file) else {
        panic!("must fail");
    };
    assert_eq!(
        error.to_string(),
        format!(
            "{}: ca.validity_days: 0 is out of range (expected 1 to 3650 days) (line 2, column 17)",
            file.display()
        )
    );
    assert!(matches!(error.without_file(), ConfigError::Invalid { .. }));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn backends_default_and_routes_name_them() {
    let empty = config("");
    assert_eq!(empty.backends.len(), 1);
    assert_eq!(empty.backends[0].name, "local");
    assert_eq!(empty.backends[0].replicas, ["http://127.0.0.1:8000"]);

    let text = "[[backend]]\nname = \"gpu\"\ndialect = \"sglang\"\nreplicas = [\"http://10.0.0.5:30000\"]\n\
                served_model = \"Qwen/Qwen3-8B\"\nmodel_map = { \"gpt-5\" = \"Qwen/Qwen3-8B\" }\n\
                [backend.sampling]\nmode = \"eval\"\n\
                [[backend]]\nname = \"small\"\ndialect = \"vllm\"\nreplicas = [\"http://10.0.0.6:8000\"]\nserved_model = \"s\"\n";
    let c = config(text);
    assert_eq!(c.backends.len(), 2);
    assert_eq!(c.backends[0].map_model("gpt-5"), "Qwen/Qwen3-8B");
    // Built-in routes go to the first backend.
    let d = c.rules.route(Some("api.openai.com"), None, 443);
    let RouteAction::Model { backend, .. } = d.action else {
        panic!("{d:?}");
    };
    assert_eq!(backend.as_deref(), Some("gpu"));

    let routed = format!(
        "{text}[[route]]\nhost = \"a.example\"\naction = \"model\"\nbackend = \"small\"\n\
         upstream = \"https://a.example\"\n"
    );
    let c = config(&routed);
    let d = c.rules.route(Some("a.example"), None, 443);
    let RouteAction::Model {
        backend, upstream, ..
    } = d.action
    else {
        panic!("{d:?}");
    };
    assert_eq!(backend.as_deref(), Some("small"));
    assert_eq!(
        upstream.map(|u| u.to_string()).as_deref(),
        Some("https://a.example")
    );
}

#[test]
fn backend_errors_name_the_key() {
    let base = "name = \"b\"\ndialect = \"vllm\"\nserved_model = \"m\"\n";
    let bad_replica = format!(
        "[[backend]]\n{base}replicas = [\"http://127.0.0.1:8000\"]\n[[backend]]\nname = \"c\"\ndialect = \"vllm\"\nserved_model = \"m\"\nreplicas = [\"http://127.0.0.1:8000\", \"https://x:1\"]\n"
    );
    let e = error(&bad_replica);
    assert!(e.to_string().starts_with("backend[1].replicas[1]: "), "{e}");
    let dup = format!(
        "[[backend]]\n{base}replicas = [\"http://127.0.0.1:8000\"]\n[[backend]]\n{base}replicas = [\"http://127.0.0.1:8001\"]\n"
    );
    let e = error(&dup);
    assert!(
        e.to_string()
            .starts_with("backend[1].name: name \"b\" is already used by backend[0]"),
        "{e}"
    );
    let timeout = format!(
        "[[backend]]\n{base}replicas = [\"http://127.0.0.1:8000\"]\nconnect_timeout_ms = 0\n"
    );
    assert!(
        error(&timeout)
            .to_string()
            .starts_with("backend[0].connect_timeout_ms: ")
    );
    let unknown = format!("[[backend]]\n{base}replicas = []\nreplica = \"x\"\n");
    assert!(
        error(&unknown)
            .to_string()
            .contains("unknown field `replica`")
    );
}
