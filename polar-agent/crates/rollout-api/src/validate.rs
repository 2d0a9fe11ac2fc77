//! Checks of what callers send: request bodies are parsed with the path of
//! the field at fault kept ([`parse`]), then a [`TaskRequest`] or
//! [`NodeRegistration`] is checked value by value. Every error names its
//! field, e.g. `num_samples: must be between 1 and 1024`.

use serde::de::DeserializeOwned;

use polar_rollout_types::{API_VERSION, NodeRegistration, TaskRequest};
use polar_spec::policy::Policy;

/// The most samples one task may ask for.
pub const MAX_SAMPLES: u32 = 1024;
/// The longest session budget (7 days).
pub const MAX_TIMEOUT_SECS: u64 = 7 * 24 * 3600;
/// The longest task or node id.
pub const MAX_ID_LEN: usize = 48;
/// The longest instruction (bytes).
pub const MAX_INSTRUCTION_BYTES: usize = 1 << 20;

/// A request body that is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ValidationError {
    /// The field at fault (`num_samples`, `agent.harness`, `body` for a
    /// body that is not JSON at all).
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

impl ValidationError {
    fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Parses a JSON body, naming the field where parsing failed.
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ValidationError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = strip_position(&inner.to_string());
        // A missing or unknown field is reported by its parent: name it.
        let field = match field_in_message(&message) {
            // Broken JSON is the body's fault, wherever it broke.
            _ if inner.is_syntax() || inner.is_eof() => "body".to_owned(),
            Some(name) if path == "." => name,
            Some(name) if message.starts_with("missing field") => format!("{path}.{name}"),
            _ if path == "." => "body".to_owned(),
            _ => path,
        };
        ValidationError::new(field, message)
    })?;
    de.end()
        .map_err(|e| ValidationError::new("body", strip_position(&e.to_string())))?;
    Ok(value)
}

/// The field named in a serde message (`missing field `x``, `unknown field
/// `x``).
fn field_in_message(message: &str) -> Option<String> {
    let rest = message
        .strip_prefix("missing field `")
        .or_else(|| message.strip_prefix("unknown field `"))?;
    rest.split('`').next().map(str::to_owned)
}

fn strip_position(message: &str) -> String {
    match message.find(" at line ") {
        Some(i) => message[..i].to_owned(),
        None => message.to_owned(),
    }
}

/// Whether `id` is a valid task or node id: 1 to 48 characters from
/// `[A-Za-z0-9._-]`, not starting with a dot (session ids derived from it
/// are valid sandbox session ids).
pub fn is_valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn check_id(field: &str, id: &str) -> Result<(), ValidationError> {
    if is_valid_id(id) {
        Ok(())
    } else {
        Err(ValidationError::new(
            field,
            format!(
                "must be 1 to {MAX_ID_LEN} characters from [A-Za-z0-9._-], not starting with '.'"
            ),
        ))
    }
}

fn check_version(version: u32) -> Result<(), ValidationError> {
    if version == API_VERSION {
        Ok(())
    } else {
        Err(ValidationError::new(
            "version",
            format!("unsupported version {version} (this server speaks {API_VERSION})"),
        ))
    }
}

/// Checks a URL the server will call: `http://` or `https://` with a host.
pub fn check_url(field: &str, url: &str) -> Result<(), ValidationError> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| ValidationError::new(field, format!("not a URL: {e}")))?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http" | "https"), Some(h)) if !h.is_empty() => Ok(()),
        _ => Err(ValidationError::new(
            field,
            "must be an http:// or https:// URL with a host",
        )),
    }
}

/// Checks that text `field` is not blank and at most `max` bytes.
pub fn check_text(field: &str, value: &str, max: usize) -> Result<(), ValidationError> {
    if value.trim().is_empty() {
        return Err(ValidationError::new(field, "must not be empty"));
    }
    if value.len() > max {
        return Err(ValidationError::new(
            field,
            format!("must be at most {max} bytes"),
        ));
    }
    Ok(())
}

/// Checks a parsed task request.
pub fn check_task(req: &TaskRequest) -> Result<(), ValidationError> {
    check_task_with(req, None)
}

/// Checks a parsed task request, and when `policy` is given (the server's
/// `[rollout.policy]`) that its spec is inside it: a spec outside is an
/// error naming the field (`runtime.mounts[0].source`).
pub fn check_task_with(req: &TaskRequest, policy: Option<&Policy>) -> Result<(), ValidationError> {
    check_version(req.version)?;
    check_id("task_id", &req.task_id)?;
    check_text("instruction", &req.instruction, MAX_INSTRUCTION_BYTES)?;
    if !(1..=MAX_SAMPLES).contains(&req.num_samples) {
        return Err(ValidationError::new(
            "num_samples",
            format!("must be between 1 and {MAX_SAMPLES}"),
        ));
    }
    if !(1..=MAX_TIMEOUT_SECS).contains(&req.timeout_secs) {
        return Err(ValidationError::new(
            "timeout_secs",
            format!("must be between 1 and {MAX_TIMEOUT_SECS}"),
        ));
    }
    check_text("agent.harness", &req.agent.harness, 64)?;
    check_text("evaluator.kind", &req.evaluator.kind, 64)?;
    let spec = crate::session_spec::SessionSpec::parse(
        &req.instruction,
        &req.agent,
        &req.runtime,
        &req.evaluator,
    )?;
    if let Some(p) = policy {
        spec.check_policy(p, req.timeout_secs)?;
    }
    if let Some(url) = &req.callback_url {
        check_url("callback_url", url)?;
    }
    if let Some(g) = &req.metadata.group_id {
        check_text("metadata.group_id", g, 256)?;
    }
    if let Some(p) = &req.metadata.policy_version {
        check_text("metadata.policy_version", p, 256)?;
    }
    if let Some(n) = req.early_stop_after
        && !(1..=req.num_samples).contains(&n)
    {
        return Err(ValidationError::new(
            "early_stop_after",
            "must be between 1 and num_samples",
        ));
    }
    Ok(())
}

/// Checks a node registration.
pub fn check_registration(reg: &NodeRegistration) -> Result<(), ValidationError> {
    check_version(reg.version)?;
    check_id("node_id", &reg.node_id)?;
    check_url("address", &reg.address)?;
    check_text("instance", &reg.instance, 128)?;
    if reg.capacity.max_sessions == 0 {
        return Err(ValidationError::new(
            "capacity.max_sessions",
            "must be at least 1",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn task(v: serde_json::Value) -> Result<TaskRequest, ValidationError> {
        let req: TaskRequest = parse(v.to_string().as_bytes())?;
        check_task(&req)?;
        Ok(req)
    }

    fn good() -> serde_json::Value {
        json!({
            "task_id": "t1", "instruction": "fix the bug", "num_samples": 4,
            "timeout_secs": 60, "agent": {"harness": "shell"},
        })
    }

    #[test]
    fn a_minimal_task_gets_defaults() {
        let req = task(good()).unwrap();
        assert_eq!(req.version, API_VERSION);
        assert_eq!(req.evaluator.kind, "session_completed");
        assert_eq!(req.builder, polar_trajectory::Builder::default());
        assert_eq!(req.priority, 0);
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (
                "num_samples",
                json!(0),
                "num_samples: must be between 1 and 1024",
            ),
            (
                "num_samples",
                json!(5000),
                "num_samples: must be between 1 and 1024",
            ),
            ("num_samples", json!("many"), "num_samples: invalid type"),
            ("task_id", json!("a/b"), "task_id: must be"),
            ("timeout_secs", json!(0), "timeout_secs: must be"),
            ("callback_url", json!("ftp://x"), "callback_url: must be"),
            ("early_stop_after", json!(9), "early_stop_after: must be"),
            (
                "builder",
                json!({"kind": "nope"}),
                "builder.kind: unknown variant",
            ),
            (
                "agent",
                json!({"options": {}}),
                "agent.harness: missing field",
            ),
            ("colour", json!(1), "colour: unknown field"),
        ];
        for (field, value, want) in cases {
            let mut v = good();
            v[field] = value;
            let e = task(v).unwrap_err();
            assert!(e.to_string().starts_with(want), "{field}: got {e}");
        }
        let mut v = good();
        v.as_object_mut().unwrap().remove("num_samples");
        assert_eq!(task(v).unwrap_err().field, "num_samples");
        let e = parse::<TaskRequest>(b"{not json").unwrap_err();
        assert_eq!(e.field, "body");
    }

    #[test]
    fn a_policy_refuses_what_it_does_not_allow_naming_the_field() {
        let raw = polar_spec::policy::RawPolicy {
            upload_roots: Some(vec!["/srv/tasks".into()]),
            max_session_secs: Some(600),
            ..Default::default()
        };
        let p = Policy::from_raw(&raw, &polar_spec::KeyPath::root()).unwrap();
        let check = |v: serde_json::Value| {
            let req: TaskRequest = parse(v.to_string().as_bytes()).unwrap();
            check_task_with(&req, Some(&p))
        };
        let mut v = good();
        v["runtime"] = json!({"prepare": [{"upload": {"from": "/srv/tasks/t1"}}]});
        assert!(check(v.clone()).is_ok());
        // Without a policy the server checks only the spec's form.
        v["runtime"] = json!({"prepare": [{"upload": {"from": "/etc/shadow"}}]});
        let req: TaskRequest = parse(v.to_string().as_bytes()).unwrap();
        assert!(check_task(&req).is_ok());
        let e = check(v).unwrap_err();
        assert_eq!(e.field, "runtime.prepare[0].upload.from");
        assert!(
            e.reason
                .contains("/etc/shadow is outside the allowed upload roots [/srv/tasks]")
        );
        let mut v = good();
        v["runtime"] = json!({"mounts": [{"source": "/", "target": "/host", "read_only": false}]});
        assert_eq!(check(v).unwrap_err().field, "runtime.mounts[0].source");
        let mut v = good();
        v["runtime"] = json!({"network": "host"});
        assert_eq!(check(v).unwrap_err().field, "runtime.network");
        let mut v = good();
        v["timeout_secs"] = json!(601);
        assert_eq!(check(v).unwrap_err().field, "timeout_secs");
        let mut v = good();
        v["agent"]["options"] = json!({"timeout_secs": 90_000});
        assert_eq!(check(v).unwrap_err().field, "agent.options.timeout_secs");
    }

    #[test]
    fn ids_are_path_safe() {
        assert!(is_valid_id("task_1.a-b"));
        for bad in ["", ".x", "a b", "a/b", &"x".repeat(49)] {
            assert!(!is_valid_id(bad), "{bad:?}");
        }
    }
}
