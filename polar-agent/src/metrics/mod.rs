//! Prometheus metrics: the text format shared with the rollout server
//! ([`text`]) and the agent's page ([`render`]), built from the counters the
//! parts already keep — the capture stage's ([`CaptureStats`]: calls,
//! tokens, backend latency and errors), the proxy's ([`ProxyStats`]:
//! connections by action, TLS handshakes), the redirect's kernel counters
//! ([`RedirectStats`]), the exporter's ([`ExportCounters`]) — plus gauges
//! the caller supplies (sessions by stage, queue depth per stage).

use std::sync::atomic::Ordering;

use polar_metrics::Text;

use polar_capture::CaptureStats;
use polar_export::ExportCounters;
use polar_proxy::ProxyStats;
use polar_proxy::error::NamedBy;
use polar_proxy::shares::Cap;
use polar_redirect::RedirectStats;

/// What the agent's page is made of; absent parts are left out.
#[derive(Debug, Default, Clone, Copy)]
pub struct AgentMetrics<'a> {
    /// The capture stage's counters.
    pub capture: Option<&'a CaptureStats>,
    /// The proxy's counters.
    pub proxy: Option<&'a ProxyStats>,
    /// The redirect's counters (a snapshot of the kernel's).
    pub redirect: Option<RedirectStats>,
    /// The exporter's counters.
    pub export: Option<&'a ExportCounters>,
    /// Sessions by stage (`queued`, `running`, `exporting`, ...).
    pub sessions_by_stage: &'a [(&'a str, u64)],
    /// Items waiting per stage.
    pub queue_depths: &'a [(&'a str, u64)],
}

/// The agent's Prometheus text page.
pub fn render(m: &AgentMetrics<'_>) -> String {
    let mut out = Text::new();
    polar_metrics::stage_gauges(&mut out, m.sessions_by_stage, m.queue_depths);
    if let Some(c) = m.capture {
        c.render(&mut out);
    }
    if let Some(p) = m.proxy {
        proxy(&mut out, p);
    }
    if let Some(r) = m.redirect {
        redirect(&mut out, &r);
    }
    if let Some(e) = m.export {
        let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        out.single(
            "polar_export_bytes_total",
            "counter",
            "Bytes of trajectory files published.",
            load(&e.bytes),
        );
        out.single(
            "polar_export_files_total",
            "counter",
            "Trajectory files published.",
            load(&e.files),
        );
        out.single(
            "polar_export_rows_total",
            "counter",
            "Rows in published files, once per format.",
            load(&e.rows),
        );
        out.single(
            "polar_export_failed_files_total",
            "counter",
            "Files abandoned after an error.",
            load(&e.failed_files),
        );
    }
    out.finish()
}

fn proxy(out: &mut Text, p: &ProxyStats) {
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    out.single(
        "polar_proxy_connections_total",
        "counter",
        "Connections the proxy handled.",
        load(&p.connections),
    );
    out.family(
        "polar_proxy_decisions_total",
        "counter",
        "Connections by routing decision.",
    );
    for (action, v) in [
        ("model", &p.model),
        ("pass", &p.passed),
        ("deny", &p.denied),
        ("over_limit", &p.over_limit),
    ] {
        out.sample(
            "polar_proxy_decisions_total",
            &[("action", action)],
            load(v),
        );
    }
    out.family(
        "polar_proxy_session_mismatch_total",
        "counter",
        "Base-URL requests refused for naming a session other than their connection's, by where they named it.",
    );
    for (via, v) in [
        (NamedBy::Header, &p.session_mismatch_header),
        (NamedBy::Key, &p.session_mismatch_key),
    ] {
        out.sample(
            "polar_proxy_session_mismatch_total",
            &[("via", via.label())],
            load(v),
        );
    }
    out.family(
        "polar_proxy_share_refused_total",
        "counter",
        "Connections and requests refused by a fair-share cap, by cap.",
    );
    for cap in Cap::ALL {
        out.sample(
            "polar_proxy_share_refused_total",
            &[("cap", cap.label())],
            p.refused.get(cap),
        );
    }
    out.family(
        "polar_tls_handshakes_total",
        "counter",
        "TLS handshakes with harnesses by result.",
    );
    out.sample(
        "polar_tls_handshakes_total",
        &[("result", "ok")],
        load(&p.tls_ok),
    );
    out.sample(
        "polar_tls_handshakes_total",
        &[("result", "failed")],
        load(&p.tls_failed),
    );
}

fn redirect(out: &mut Text, r: &RedirectStats) {
    out.family(
        "polar_redirect_total",
        "counter",
        "Kernel-side redirect events by kind.",
    );
    for (kind, v) in [
        ("tcp_redirected", r.tcp_redirected),
        ("dns_redirected", r.dns_redirected),
        ("denied", r.denied),
        ("local_bypass", r.local_bypass),
        ("sock_record_failed", r.sock_record_failed),
        ("record_missing", r.record_missing),
        ("conn_record_failed", r.conn_record_failed),
        ("conn_never_established", r.conn_never_established),
    ] {
        out.sample("polar_redirect_total", &[("kind", kind)], v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_part_renders_and_absent_parts_are_left_out() {
        let proxy = ProxyStats::default();
        proxy.tls_ok.fetch_add(3, Ordering::Relaxed);
        proxy.session_mismatch_key.fetch_add(2, Ordering::Relaxed);
        let export = ExportCounters::default();
        export.bytes.fetch_add(1234, Ordering::Relaxed);
        let text = render(&AgentMetrics {
            capture: Some(&CaptureStats::default()),
            proxy: Some(&proxy),
            redirect: Some(RedirectStats {
                tcp_redirected: 9,
                ..RedirectStats::default()
            }),
            export: Some(&export),
            sessions_by_stage: &[("running", 2)],
            queue_depths: &[("export", 5)],
        });
        for line in [
            "polar_sessions{stage=\"running\"} 2\n",
            "polar_queue_depth{stage=\"export\"} 5\n",
            "polar_capture_calls_total 0\n",
            "polar_tls_handshakes_total{result=\"ok\"} 3\n",
            "polar_proxy_session_mismatch_total{via=\"key\"} 2\n",
            "polar_proxy_share_refused_total{cap=\"session_streams\"} 0\n",
            "polar_redirect_total{kind=\"tcp_redirected\"} 9\n",
            "polar_export_bytes_total 1234\n",
            "polar_backend_latency_seconds_count 0\n",
        ] {
            assert!(text.contains(line), "{line:?} in\n{text}");
        }
        let bare = render(&AgentMetrics::default());
        assert!(!bare.contains("polar_proxy"), "{bare}");
        assert!(!bare.contains("polar_capture"), "{bare}");
    }
}
