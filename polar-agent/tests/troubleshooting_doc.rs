//! Every message docs/TROUBLESHOOTING.md quotes is still produced by the
//! code: the error values are built here and their text looked up in the
//! doc; log messages are looked up in the source that logs them.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed step fails the test"
)]

use caps::Capability;
use polar_node::agent::{AgentError, StateDirError};
use polar_redirect::{CgroupError, PreflightError};
use polar_trajectory::DropReason;

fn doc() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/TROUBLESHOOTING.md"
    ))
    .unwrap()
}

fn quoted(doc: &str, text: &str) {
    assert!(
        doc.contains(text),
        "docs/TROUBLESHOOTING.md does not quote:\n{text}"
    );
}

#[test]
fn every_quoted_error_is_the_codes_text() {
    let doc = doc();
    quoted(
        &doc,
        &PreflightError::KernelTooOld("5.10.0-28-amd64".into()).to_string(),
    );
    quoted(&doc, &CgroupError::NoCgroup2.to_string());
    let caps = PreflightError::Capabilities(vec![(
        Capability::CAP_BPF,
        polar_redirect::preflight::REQUIRED[0].1,
    )]);
    quoted(&doc, &caps.to_string());
    quoted(
        &doc,
        &StateDirError::Writable {
            dir: "/var/lib/polar".into(),
            mode: 0o777,
        }
        .to_string(),
    );
    quoted(
        &doc,
        &StateDirError::Owner {
            dir: "/var/lib/polar".into(),
            owner: 1000,
            uid: 0,
        }
        .to_string(),
    );
    quoted(
        &doc,
        &AgentError::CaTooNarrow {
            dir: "/var/lib/polar".into(),
            missing: "api.example.com".into(),
        }
        .to_string(),
    );
    quoted(
        &doc,
        &serde_json::to_string(&DropReason::TokenIdsMissing).unwrap(),
    );
    quoted(&doc, "\"token_ids_missing\":true");
    let plain = polar_rollout_api::tls::TlsSettings::plain("rollout.tls")
        .check_listen("rollout.listen", "10.0.0.2:7070".parse().unwrap())
        .unwrap_err();
    quoted(&doc, &plain.to_string());
    quoted(
        &doc,
        &rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer).to_string(),
    );
    for alert in [
        rustls::AlertDescription::UnknownCA,
        rustls::AlertDescription::BadCertificate,
    ] {
        quoted(&doc, &rustls::Error::AlertReceived(alert).to_string());
    }
}

#[test]
fn quoted_log_messages_are_still_logged() {
    let doc = doc();
    let proxy = include_str!("../crates/proxy/src/lib.rs");
    quoted(&doc, "TLS handshake failed");
    assert!(proxy.contains("\"TLS handshake failed\""));
    // The record field is spelled as the doc says.
    let record = include_str!("../crates/record/src/lib.rs");
    assert!(record.contains("pub token_ids_missing: bool"));
}
