//! The live timeline: the real gateway node reports a running session's
//! calls as its work lists them (only the new ones each time); the server
//! publishes each report as a `calls` event, shows the calls so far with
//! the sample, refuses oversized or stale reports, and drops them when
//! the result comes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Method;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::events::Event;
use polar_gateway::stages::{InitError, Job, Reached, Report};
use polar_rollout_api::sse::EventStream;
use polar_rollout_api::{MAX_LIVE_CALLS, SampleStatus};

/// Runs until `release` fires; its calls are whatever the test pushed.
#[derive(Clone, Default)]
struct Calling {
    calls: Arc<Mutex<Vec<Value>>>,
    release: CancellationToken,
}

impl Work for Calling {
    type Prepared = ();
    type Ran = ();

    async fn init(&self, _job: &Arc<Job>, _stop: CancellationToken) -> Result<(), InitError> {
        Ok(())
    }

    async fn run(&self, _job: &Arc<Job>, _p: &mut (), stop: CancellationToken) {
        tokio::select! {
            () = stop.cancelled() => {}
            () = self.release.cancelled() => {}
        }
    }

    fn calls_since(&self, _job: &Job, from: usize) -> Vec<Value> {
        self.calls
            .lock()
            .unwrap()
            .get(from..)
            .unwrap_or_default()
            .to_vec()
    }

    async fn postrun(&self, _job: &Arc<Job>, _p: Option<()>, _r: Reached<()>) -> Report {
        let calls = self.calls.lock().unwrap().clone();
        let mut stats = serde_json::Map::new();
        stats.insert("calls_total".into(), calls.len().into());
        stats.insert("calls".into(), calls.into());
        Report {
            stats,
            reward: Some(1.0),
            ..Report::new(SampleStatus::Completed)
        }
    }
}

fn call(seq: u64) -> Value {
    json!({"call_id": format!("c{seq}"), "seq": seq, "api": "openai_chat", "model": "m",
           "received_ms": 1000 + seq * 100, "sent_ms": 1002 + seq * 100,
           "first_token_ms": 1010 + seq * 100, "finished_ms": 1050 + seq * 100,
           "status": "completed", "retry_of": null})
}

/// The next `calls` event's calls (other events skipped).
async fn next_calls(stream: &mut EventStream) -> (u32, Vec<Value>) {
    let wait = async {
        while let Some(n) = stream.next().await {
            if let Event::Calls {
                session_id,
                sample_index,
                attempt,
                calls,
                ..
            } = n.event
            {
                assert_eq!((session_id.as_str(), sample_index), ("live-s0", 0));
                return (attempt, calls);
            }
        }
        panic!("the event stream ended");
    };
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .expect("a calls event within 10 s")
}

/// A server, its client and event stream, and a node with [`Calling`]
/// work running task `live`'s one session.
struct Live {
    _env: Env,
    server: RolloutServer,
    c: RolloutClient,
    stream: EventStream,
    work: Calling,
    node: Node<Calling>,
}

/// [`Live`], once the session runs.
async fn running(progress: Progress) -> Live {
    let env = env();
    let server = start(&env.cfg).await;
    let c = client(&server);
    let stream = EventStream::connect(&server.url(), TOKEN, "task_id=live")
        .await
        .unwrap();
    let work = Calling::default();
    let node = node_a_reporting(&server, work.clone(), progress).await;
    c.submit(&task("live", 1)).await.unwrap();
    task_until(&c, "live", "running", Duration::from_secs(10), |v| {
        v.counts.running == 1
    })
    .await;
    Live {
        _env: env,
        server,
        c,
        stream,
        work,
        node,
    }
}

async fn sample(c: &RolloutClient) -> Value {
    let (code, body) = c
        .raw(Method::GET, "/v1/tasks/live/samples/0", None)
        .await
        .unwrap();
    assert_eq!(code, StatusCode::OK);
    serde_json::from_slice(&body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_session_s_calls_are_published_and_shown_until_its_result() {
    let Live {
        _env,
        server,
        c,
        mut stream,
        work,
        node,
    } = running(Progress::All).await;

    // Two calls end: one report with both.
    work.calls.lock().unwrap().extend([call(0), call(1)]);
    let (attempt, calls) = next_calls(&mut stream).await;
    assert_eq!(attempt, 1);
    assert_eq!(calls, [call(0), call(1)]);
    let s = sample(&c).await;
    assert_eq!(s["state"], "running");
    assert_eq!(s["live_calls"], json!([call(0), call(1)]));
    assert_eq!(s["live_calls_total"], 2);
    // A third: only it is reported.
    work.calls.lock().unwrap().push(call(2));
    let (_, calls) = next_calls(&mut stream).await;
    assert_eq!(calls, [call(2)]);
    assert_eq!(sample(&c).await["live_calls"].as_array().unwrap().len(), 3);
    // The task's view does not carry them.
    let (_, body) = c.raw(Method::GET, "/v1/tasks/live", None).await.unwrap();
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert!(v["samples"][0].get("live_calls").is_none(), "{v}");

    // Reports too large, not of objects, or of another dispatch.
    let as_node = RolloutClient::new(server.url(), Some(NODE_TOKEN.into()));
    let report = |attempt: u32, calls: Vec<Value>| {
        json!({"node_id": "node-a", "attempt": attempt, "stage": "running", "calls": calls})
            .to_string()
            .into_bytes()
    };
    let too_many = (0..=MAX_LIVE_CALLS as u64).map(call).collect();
    for (body, want) in [
        (report(1, too_many), StatusCode::BAD_REQUEST),
        (report(1, vec![json!(7)]), StatusCode::BAD_REQUEST),
        (report(2, vec![call(9)]), StatusCode::CONFLICT),
    ] {
        let (code, body) = as_node
            .raw(Method::POST, "/v1/sessions/live-s0/state", Some(body))
            .await
            .unwrap();
        assert_eq!(code, want, "{body:?}");
        if want == StatusCode::BAD_REQUEST {
            let v: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["error"]["field"], "calls", "{v}");
        }
    }
    assert_eq!(sample(&c).await["live_calls_total"], 3);

    // Past the bound: the server keeps the first MAX_LIVE_CALLS and
    // counts the rest.
    let batch = |from: u64| (from..from + MAX_LIVE_CALLS as u64 / 2).map(call).collect();
    for from in [100, 1000, 2000] {
        let (code, _) = as_node
            .raw(
                Method::POST,
                "/v1/sessions/live-s0/state",
                Some(report(1, batch(from))),
            )
            .await
            .unwrap();
        assert_eq!(code, StatusCode::OK);
    }
    let s = sample(&c).await;
    assert_eq!(s["live_calls"].as_array().unwrap().len(), MAX_LIVE_CALLS);
    assert_eq!(s["live_calls_total"], 3 + 3 * (MAX_LIVE_CALLS / 2));
    assert_eq!(s["live_calls"][3], call(100));

    // The result: its list, and the live calls are gone.
    work.release.cancel();
    let v = finished(&c, "live", Duration::from_secs(10)).await;
    assert_eq!(v.status, TaskStatus::Completed);
    let s = sample(&c).await;
    assert_eq!(s["state"], "done");
    assert!(s.get("live_calls").is_none(), "{s}");
    assert!(s.get("live_calls_total").is_none(), "{s}");
    assert_eq!(s["result"]["stats"]["calls"].as_array().unwrap().len(), 3);
    node.stop().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_reports_at_most_the_bound_of_a_session_s_calls() {
    let Live {
        _env,
        server,
        c,
        mut stream,
        work,
        node,
    } = running(Progress::Running).await;
    let n = MAX_LIVE_CALLS as u64 + 40;
    work.calls.lock().unwrap().extend((0..n).map(call));
    let (_, calls) = next_calls(&mut stream).await;
    assert_eq!(calls.len(), MAX_LIVE_CALLS, "one report, cut at the bound");
    assert_eq!(calls[0], call(0));
    // The rest is never reported: no second report within three ticks.
    let more = tokio::time::timeout(Duration::from_secs(3), next_calls(&mut stream)).await;
    assert!(more.is_err(), "calls past the bound were reported");
    assert_eq!(sample(&c).await["live_calls_total"], MAX_LIVE_CALLS);
    work.release.cancel();
    finished(&c, "live", Duration::from_secs(10)).await;
    node.stop().await;
    server.shutdown().await;
}
