//! Delivery of a finished task's results to its `callback_url`: in the
//! background, a bounded number of POSTs with exponential backoff and
//! jitter. Each attempt is recorded in the database, so a restart resumes
//! delivery; a URL that is down never holds the task, whose results can
//! always be polled.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, header};
use http_body_util::Full;

use super::config::CallbackConfig;
use super::core::Core;
use polar_rollout_api::http::bearer_value;
use polar_rollout_api::{CallbackState, CallbackView};

/// The backoff before attempt `attempt + 1` (after `attempt` failures):
/// `initial * 2^(attempt-1)`, capped, times a random factor in [0.5, 1].
pub fn backoff(cfg: &CallbackConfig, attempt: u32, jitter: f64) -> Duration {
    let exp = attempt.saturating_sub(1).min(30);
    let base = cfg
        .initial_backoff
        .saturating_mul(1u32 << exp)
        .min(cfg.max_backoff);
    base.mul_f64(0.5 + 0.5 * jitter.clamp(0.0, 1.0))
}

/// Delivers the task's results, retrying until the attempts run out.
pub async fn deliver(core: Arc<Core>, task_id: String) {
    loop {
        let read = core
            .read(|s| {
                let (url, view) = s.callback_target(&task_id)?;
                Some((url, view, s.callback_of(&task_id)?))
            })
            .await;
        let (url, view, mut cb) = match read {
            Ok(Some(found)) => found,
            Ok(None) => return,
            Err(e) => {
                // The next change or read rebuilds the state; a restored
                // task with a pending callback is called back again.
                tracing::error!(task = %task_id, error = %e, "callback state unreadable");
                return;
            }
        };
        if cb.state != CallbackState::Pending {
            return;
        }
        cb.attempts += 1;
        let outcome = post(&core, &url, &task_id, &view).await;
        let done = match outcome {
            Ok(()) => {
                tracing::info!(task = %task_id, attempts = cb.attempts, "results delivered to the callback");
                cb.state = CallbackState::Delivered;
                cb.last_error = None;
                true
            }
            Err(e) => {
                core.metrics.callback_failed();
                tracing::warn!(task = %task_id, attempt = cb.attempts, error = %e, "callback failed");
                cb.last_error = Some(e);
                if cb.attempts >= core.cfg.callback.max_attempts {
                    cb.state = CallbackState::Failed;
                    true
                } else {
                    false
                }
            }
        };
        let attempts = cb.attempts;
        if let Err(e) = record(&core, &task_id, cb).await {
            tracing::error!(task = %task_id, error = %e, "callback state not committed");
        }
        if done {
            return;
        }
        let wait = backoff(&core.cfg.callback, attempts, rand::random::<f64>());
        tokio::time::sleep(wait).await;
    }
}

async fn record(
    core: &Arc<Core>,
    task_id: &str,
    cb: CallbackView,
) -> Result<(), super::store::StoreError> {
    core.apply(|s, _, _| s.callback_update(task_id, cb)).await
}

async fn post(
    core: &Core,
    url: &str,
    task_id: &str,
    view: &polar_rollout_api::TaskView,
) -> Result<(), String> {
    let body = serde_json::to_vec(view).map_err(|e| e.to_string())?;
    let mut req = Request::builder()
        .method(Method::POST)
        .uri(url)
        .header(header::CONTENT_TYPE, "application/json")
        .header("x-polar-task-id", task_id);
    if let Some(t) = &core.cfg.callback_token {
        req = req.header(header::AUTHORIZATION, bearer_value(t));
    }
    let req = req
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let timeout = core.cfg.callback.timeout;
    match tokio::time::timeout(timeout, core.http.request(req)).await {
        Ok(Ok(resp)) if resp.status().is_success() => Ok(()),
        Ok(Ok(resp)) => Err(format!("callback answered {}", resp.status())),
        Ok(Err(e)) => Err(polar_io::chain(&e)),
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_with_jitter() {
        let cfg = CallbackConfig {
            max_attempts: 8,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(1000),
            timeout: Duration::from_secs(1),
        };
        assert_eq!(backoff(&cfg, 1, 1.0), Duration::from_millis(100));
        assert_eq!(backoff(&cfg, 2, 1.0), Duration::from_millis(200));
        assert_eq!(backoff(&cfg, 3, 0.0), Duration::from_millis(200));
        assert_eq!(backoff(&cfg, 10, 1.0), Duration::from_millis(1000));
        assert_eq!(backoff(&cfg, 100, 1.0), Duration::from_millis(1000));
    }
}
