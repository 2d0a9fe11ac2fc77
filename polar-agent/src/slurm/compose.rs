//! The job's configuration files, composed from the operator's (pure):
//! the operator's files tune the server (`[rollout]`: retries, retention,
//! policy...) and the nodes (backends, routes, `[sandbox]`, `[gateway]`
//! workers, export, policy); everything that is the job's own (addresses,
//! identities, tokens, certificates, the state directory) is set here, and
//! an operator's file that sets one of those keys is refused naming it,
//! since the job would silently override it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use toml::{Table, Value};

/// `[rollout]` keys that belong to the job.
const JOB_ROLLOUT_KEYS: [&str; 10] = [
    "listen",
    "database",
    "tokens",
    "token_files",
    "node_tokens",
    "node_token_dir",
    "gateway_token",
    "gateway_token_file",
    "tls",
    "verify_gateway_as",
];

/// `[gateway]` keys that belong to the job.
const JOB_GATEWAY_KEYS: [&str; 10] = [
    "server",
    "node_id",
    "listen",
    "advertise",
    "token",
    "token_file",
    "token_dir",
    "accept_tokens",
    "accept_token_files",
    "tls",
];

/// The longest the gateways' drain may be, below `KillWait`: after
/// SIGTERM the node must still hand its sessions back and flush before
/// Slurm's SIGKILL.
const DRAIN_MARGIN: Duration = Duration::from_secs(5);

/// The rollout server's side of the job.
#[derive(Debug, Clone)]
pub struct ServerSide {
    pub listen: SocketAddr,
    pub database: PathBuf,
    pub trainer_token_file: PathBuf,
    pub gateway_token_file: PathBuf,
    pub node_token_dir: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub ca_file: PathBuf,
}

/// One node's side of the job.
#[derive(Debug, Clone)]
pub struct NodeSide {
    pub state_dir: PathBuf,
    pub server_url: String,
    pub node_id: String,
    pub listen: SocketAddr,
    pub token_file: PathBuf,
    pub accept_token_file: PathBuf,
    pub drain_secs: u64,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub ca_file: PathBuf,
}

fn parse(text: &str) -> Result<Table, String> {
    text.parse::<Table>().map_err(|e| e.message().to_owned())
}

fn path(p: &Path) -> Value {
    Value::String(p.display().to_string())
}

/// The table `name` of `doc` (made when absent); an error when `name` is
/// not a table.
fn table<'a>(doc: &'a mut Table, name: &str) -> Result<&'a mut Table, String> {
    doc.entry(name)
        .or_insert_with(|| Value::Table(Table::new()))
        .as_table_mut()
        .ok_or_else(|| format!("{name}: must be a table"))
}

/// Refuses `owned` keys in `t`, naming the first.
fn refuse_job_keys(t: &Table, prefix: &str, owned: &[&str]) -> Result<(), String> {
    match owned.iter().find(|k| t.contains_key(**k)) {
        Some(k) => Err(format!(
            "{prefix}.{k}: set by `polar slurm` for each job; leave it out"
        )),
        None => Ok(()),
    }
}

/// `rollout.toml`: the operator's file (or nothing) with the job's keys.
pub fn rollout_config(operator: Option<&str>, job: &ServerSide) -> Result<String, String> {
    let mut doc = parse(operator.unwrap_or(""))?;
    let r = table(&mut doc, "rollout")?;
    refuse_job_keys(r, "rollout", &JOB_ROLLOUT_KEYS)?;
    r.insert("listen".into(), Value::String(job.listen.to_string()));
    r.insert("database".into(), path(&job.database));
    r.insert(
        "token_files".into(),
        Value::Array(vec![path(&job.trainer_token_file)]),
    );
    r.insert("gateway_token_file".into(), path(&job.gateway_token_file));
    r.insert("node_token_dir".into(), path(&job.node_token_dir));
    let mut tls = Table::new();
    tls.insert("cert_file".into(), path(&job.cert_file));
    tls.insert("key_file".into(), path(&job.key_file));
    tls.insert("ca_file".into(), path(&job.ca_file));
    // Nodes present their certificates: a node's token is taken only with
    // a certificate naming its node id.
    tls.insert("client_ca_file".into(), path(&job.ca_file));
    r.insert("tls".into(), Value::Table(tls));
    Ok(doc.to_string())
}

/// The state directory the operator's file gives (`agent.state_dir`), if
/// any.
pub fn operator_state_dir(operator: &str) -> Result<Option<PathBuf>, String> {
    let doc = parse(operator)?;
    Ok(doc
        .get("agent")
        .and_then(Value::as_table)
        .and_then(|a| a.get("state_dir"))
        .and_then(Value::as_str)
        .map(PathBuf::from))
}

/// Checks the operator's node configuration before anything starts: it
/// parses, sets none of the job's `[gateway]` keys, and exports to a
/// place that outlives the job (`gateway.export`: each node's state
/// directory is the job's and is removed with it).
pub fn check_node_config(operator: &str) -> Result<(), String> {
    let mut doc = parse(operator)?;
    let g = table(&mut doc, "gateway")?;
    refuse_job_keys(g, "gateway", &JOB_GATEWAY_KEYS)?;
    if !g.contains_key("export") {
        return Err(
            "gateway.export: required under `polar slurm` (a shared directory or \
             s3://bucket/prefix): each node's state directory lasts as long as the job"
                .into(),
        );
    }
    Ok(())
}

/// A node's `agent.toml`: the operator's file with the job's keys.
pub fn node_config(operator: &str, job: &NodeSide) -> Result<String, String> {
    check_node_config(operator)?;
    let mut doc = parse(operator)?;
    table(&mut doc, "agent")?.insert("state_dir".into(), path(&job.state_dir));
    let g = table(&mut doc, "gateway")?;
    g.insert("server".into(), Value::String(job.server_url.clone()));
    g.insert("node_id".into(), Value::String(job.node_id.clone()));
    g.insert("listen".into(), Value::String(job.listen.to_string()));
    g.insert("token_file".into(), path(&job.token_file));
    g.insert(
        "accept_token_files".into(),
        Value::Array(vec![path(&job.accept_token_file)]),
    );
    let drain = g
        .get("drain_timeout_secs")
        .and_then(Value::as_integer)
        .and_then(|d| u64::try_from(d).ok())
        .map_or(job.drain_secs, |d| d.min(job.drain_secs));
    g.insert(
        "drain_timeout_secs".into(),
        Value::Integer(i64::try_from(drain).unwrap_or(i64::MAX)),
    );
    let mut tls = Table::new();
    tls.insert("cert_file".into(), path(&job.cert_file));
    tls.insert("key_file".into(), path(&job.key_file));
    // The server's pushes are verified by the gateway token; no client
    // certificate is asked for, so a trainer's pause and resume (which go
    // to the nodes) need only the job's CA and that token.
    tls.insert("ca_file".into(), path(&job.ca_file));
    g.insert("tls".into(), Value::Table(tls));
    Ok(doc.to_string())
}

/// The gateways' drain time for a cluster's `KillWait`.
pub fn drain_secs(kill_wait: Duration) -> u64 {
    kill_wait.saturating_sub(DRAIN_MARGIN).as_secs().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> ServerSide {
        ServerSide {
            listen: "10.0.0.2:0".parse().unwrap(),
            database: "/jobs/7/rollout.sqlite".into(),
            trainer_token_file: "/jobs/7/tokens/trainer".into(),
            gateway_token_file: "/jobs/7/tokens/gateway".into(),
            node_token_dir: "/jobs/7/tokens/nodes".into(),
            cert_file: "/jobs/7/tls/rollout.crt".into(),
            key_file: "/jobs/7/tls/rollout.key".into(),
            ca_file: "/jobs/7/tls/ca.crt".into(),
        }
    }

    fn node() -> NodeSide {
        NodeSide {
            state_dir: "/var/lib/polar/slurm/7/n1".into(),
            server_url: "https://10.0.0.2:7070".into(),
            node_id: "n1".into(),
            listen: "10.0.0.3:0".parse().unwrap(),
            token_file: "/jobs/7/tokens/nodes/n1".into(),
            accept_token_file: "/jobs/7/tokens/gateway".into(),
            drain_secs: 15,
            cert_file: "/jobs/7/tls/n1.crt".into(),
            key_file: "/jobs/7/tls/n1.key".into(),
            ca_file: "/jobs/7/tls/ca.crt".into(),
        }
    }

    #[test]
    fn the_server_gets_the_jobs_identities_and_keeps_the_operators_tuning() {
        let text = rollout_config(Some("[rollout]\nmax_retries = 5\n"), &server()).unwrap();
        let doc = parse(&text).unwrap();
        let r = doc["rollout"].as_table().unwrap();
        assert_eq!(r["max_retries"].as_integer(), Some(5));
        assert_eq!(r["listen"].as_str(), Some("10.0.0.2:0"));
        assert_eq!(
            r["tls"]["client_ca_file"].as_str(),
            Some("/jobs/7/tls/ca.crt")
        );
        let empty = rollout_config(None, &server()).unwrap();
        assert!(parse(&empty).unwrap()["rollout"]["node_token_dir"].is_str());
    }

    #[test]
    fn operator_files_setting_the_jobs_keys_are_refused_naming_the_key() {
        let e = rollout_config(Some("[rollout]\ntokens = [\"abcdefgh12\"]\n"), &server());
        assert!(e.unwrap_err().starts_with("rollout.tokens:"));
        let e = rollout_config(Some("[rollout.tls]\ncert_file = \"/x\"\n"), &server());
        assert!(e.unwrap_err().starts_with("rollout.tls:"));
        let e = rollout_config(Some("rollout = 3\n"), &server());
        assert_eq!(e.unwrap_err(), "rollout: must be a table");
        let base = "[gateway]\nexport = \"/shared/t\"\n";
        for key in [
            "server = \"https://x\"",
            "node_id = \"n\"",
            "token = \"abcdefgh\"",
        ] {
            let e = node_config(&format!("{base}{key}\n"), &node()).unwrap_err();
            let name = key.split(' ').next().unwrap();
            assert!(e.starts_with(&format!("gateway.{name}:")), "{e}");
        }
        let e = check_node_config("[[backend]]\nname = \"b\"\n").unwrap_err();
        assert!(e.starts_with("gateway.export:"), "{e}");
        assert!(check_node_config("[gateway\n").is_err());
    }

    #[test]
    fn a_node_gets_its_identity_and_a_drain_below_kill_wait() {
        let base = "[agent]\nstate_dir = \"/elsewhere\"\n\n[[backend]]\nname = \"local\"\n\n\
                    [gateway]\nexport = \"/shared/t\"\nrunning_workers = 4\ndrain_timeout_secs = 60\n";
        let text = node_config(base, &node()).unwrap();
        // The gateway's own parser takes it.
        let gw = polar_node::gateway::GatewayConfig::from_toml_with_env(&text, |_| None)
            .unwrap()
            .unwrap();
        assert_eq!(gw.node_id, "n1");
        assert_eq!(gw.drain_timeout, Duration::from_secs(15));
        let doc = parse(&text).unwrap();
        assert_eq!(
            doc["agent"]["state_dir"].as_str(),
            Some("/var/lib/polar/slurm/7/n1")
        );
        let g = doc["gateway"].as_table().unwrap();
        assert_eq!(g["running_workers"].as_integer(), Some(4));
        assert_eq!(g["drain_timeout_secs"].as_integer(), Some(15));
        assert_eq!(g["node_id"].as_str(), Some("n1"));
        assert_eq!(g["tls"]["key_file"].as_str(), Some("/jobs/7/tls/n1.key"));
        assert_eq!(doc["backend"][0]["name"].as_str(), Some("local"));
        let short = base.replace("= 60", "= 3");
        let doc = parse(&node_config(&short, &node()).unwrap()).unwrap();
        assert_eq!(doc["gateway"]["drain_timeout_secs"].as_integer(), Some(3));
        assert_eq!(
            operator_state_dir(base).unwrap(),
            Some(PathBuf::from("/elsewhere"))
        );
        assert_eq!(drain_secs(Duration::from_secs(20)), 15);
        assert_eq!(drain_secs(Duration::from_secs(30)), 25);
        assert_eq!(drain_secs(Duration::from_secs(2)), 1);
    }
}
