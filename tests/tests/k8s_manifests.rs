//! The Kubernetes manifests in deploy/k8s parse (python3's yaml module, the
//! parser kubectl's users know) and hold what running Polar needs: a
//! privileged agent DaemonSet with the host's cgroup and bpffs mounted, its
//! config from a ConfigMap that the real config parser accepts, state on a
//! hostPath; a single-replica rollout Deployment with the Recreate strategy
//! and its SQLite on a volume, a Service, tokens and certificates from
//! Secrets; both listen on the pod's address (downward API `status.podIP`),
//! not on every interface, over HTTPS with the cluster CA's certificates
//! (made here with `polar rollout ca`'s code and mounted where the pods
//! mount them: the configurations load them and pass the plain-HTTP rule).

use std::path::Path;
use std::process::Command;

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::Value;

const TO_JSON: &str = r#"
import json, sys, yaml
docs = []
for path in sys.argv[1:]:
    with open(path) as f:
        for d in yaml.safe_load_all(f):
            if d is not None:
                d["__file"] = path
                docs.append(d)
print(json.dumps(docs))
"#;

/// Makes python3's `yaml` module importable: the set-up installs Debian's
/// `python3-yaml`, but the `python3` on `PATH` may be another interpreter;
/// then pyyaml comes from PyPI (a failed install fails the test with pip's
/// output).
fn ensure_yaml_module() -> Result<()> {
    let has = |py: &mut Command| {
        py.args(["-c", "import yaml"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if has(&mut Command::new("python3")) {
        return Ok(());
    }
    let out = Command::new("python3")
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "pyyaml",
        ])
        .output()
        .context("running python3 -m pip")?;
    ensure!(
        out.status.success() && has(&mut Command::new("python3")),
        "pip install pyyaml failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

fn manifests() -> Result<Vec<Value>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/k8s");
    let mut files: Vec<String> = std::fs::read_dir(&dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .map(|p| p.display().to_string())
        .collect();
    files.sort();
    ensure!(!files.is_empty(), "no manifests in {}", dir.display());
    ensure_yaml_module()?;
    let out = Command::new("python3")
        .args(["-c", TO_JSON])
        .args(&files)
        .output()
        .context("running python3 (with the yaml module: pip install pyyaml)")?;
    if !out.status.success() {
        bail!(
            "the manifests do not parse: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let v: Value = serde_json::from_slice(&out.stdout)?;
    Ok(v.as_array().cloned().unwrap_or_default())
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> Result<&'a Value> {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .with_context(|| format!("no {kind} {name}"))
}

fn mount_of<'a>(pod: &'a Value, container: &Value, path: &str) -> Result<&'a Value> {
    let mount = container["volumeMounts"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["mountPath"] == path))
        .with_context(|| format!("nothing mounted at {path}"))?;
    pod["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == mount["name"]))
        .with_context(|| format!("no volume {}", mount["name"]))
}

/// A container's environment: literal values, and `fieldRef:<path>` for
/// the downward API's.
fn pod_env(container: &Value) -> Result<std::collections::HashMap<String, String>> {
    let mut out = std::collections::HashMap::new();
    for e in container["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().context("an env entry without a name")?;
        let value = match (
            e["value"].as_str(),
            e["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        ) {
            (Some(v), _) => v.to_owned(),
            (None, Some(f)) => format!("fieldRef:{f}"),
            (None, None) => continue,
        };
        out.insert(name.to_owned(), value);
    }
    Ok(out)
}

/// A cluster CA of a temporary directory.
struct Pki {
    _dir: tempfile::TempDir,
    ca: polar_io::tls::ca::ClusterCa,
}

impl Pki {
    fn new() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let ca = polar_io::tls::ca::ClusterCa::init(
            &dir.path().join("ca"),
            std::time::Duration::from_secs(86_400),
        )?;
        Ok(Self { _dir: dir, ca })
    }

    /// Writes `name`'s certificate as a mounted Secret would: `<stem>.crt`,
    /// `<stem>.key` (mode `mode`) and `ca.crt` in `dir`.
    fn mount(&self, dir: &Path, name: &str, stem: &str, mode: u32) -> Result<()> {
        use std::os::unix::fs::PermissionsExt as _;
        let out = self._dir.path().join("issued");
        let req = polar_io::tls::ca::IssueRequest {
            name: name.into(),
            dns: vec![],
            ips: vec![],
            validity: std::time::Duration::from_secs(86_400),
        };
        let issued = self.ca.issue(&req, &out)?;
        std::fs::create_dir_all(dir)?;
        std::fs::copy(&issued.cert, dir.join(format!("{stem}.crt")))?;
        let key = dir.join(format!("{stem}.key"));
        std::fs::copy(&issued.key, &key)?;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(mode))?;
        std::fs::copy(self.ca.cert_path(), dir.join("ca.crt"))?;
        Ok(())
    }
}

#[test]
fn every_manifest_parses_with_the_essential_fields() -> Result<()> {
    let docs = manifests()?;
    for d in &docs {
        ensure!(d["apiVersion"].is_string() && d["kind"].is_string(), "{d}");
        ensure!(d["metadata"]["name"].is_string(), "{d}");
        if d["kind"] != "Namespace" {
            ensure!(d["metadata"]["namespace"] == "polar", "{d}");
        }
    }

    // The agent: privileged, host cgroup2 and bpffs, config and state.
    let ds = find(&docs, "DaemonSet", "polar-agent")?;
    let pod = &ds["spec"]["template"]["spec"];
    let agent = &pod["containers"][0];
    ensure!(agent["securityContext"]["privileged"] == true);
    ensure!(pod["hostPID"] == true);
    ensure!(pod["terminationGracePeriodSeconds"].as_u64() >= Some(300));
    ensure!(agent["args"] == serde_json::json!(["agent", "--config", "/etc/polar/agent.toml"]));
    ensure!(mount_of(pod, agent, "/sys/fs/cgroup")?["hostPath"]["path"] == "/sys/fs/cgroup");
    ensure!(mount_of(pod, agent, "/sys/fs/bpf")?["hostPath"]["path"] == "/sys/fs/bpf");
    ensure!(mount_of(pod, agent, "/var/lib/polar")?["hostPath"]["path"].is_string());
    let cfg = mount_of(pod, agent, "/etc/polar")?["configMap"]["name"].clone();
    let cm = find(&docs, "ConfigMap", cfg.as_str().unwrap_or_default())?;
    let text = cm["data"]["agent.toml"].as_str().context("no agent.toml")?;
    let config = polar_config::Config::from_toml_str(text)?;
    ensure!(config.agent.state_dir == Path::new("/var/lib/polar"));
    // The gateway: the pod's address from the downward API, HTTPS with its
    // node's certificate from the polar-node-tls Secret.
    let env = pod_env(agent)?;
    ensure!(env["POD_IP"] == "fieldRef:status.podIP", "{env:?}");
    ensure!(env["POLAR_GATEWAY_LISTEN"] == "$(POD_IP):7071", "{env:?}");
    ensure!(
        env["POLAR_GATEWAY_ADVERTISE"] == "https://$(POD_IP):7071",
        "{env:?}"
    );
    let tls = mount_of(pod, agent, "/run/secrets/polar-tls")?;
    ensure!(tls["secret"]["secretName"] == "polar-node-tls", "{tls}");
    ensure!(tls["secret"]["defaultMode"] == 0o400, "{tls}");
    let pki = Pki::new()?;
    let root = tempfile::tempdir()?;
    let tls_dir = root.path().join("run/secrets/polar-tls");
    pki.mount(&tls_dir, "gpu-node-1", "gpu-node-1", 0o400)?;
    let pod_ip = |v: &str| v.replace("$(POD_IP)", "10.1.2.3");
    let text_here = text.replace("\"/run/", &format!("\"{}/run/", root.path().display()));
    let gw = polar_node::gateway::GatewayConfig::from_toml_with_env(&text_here, |k| match k {
        "POLAR_GATEWAY_NODE_ID" => Some("gpu-node-1".into()),
        "POLAR_GATEWAY_TOKEN" => Some("k8s-test-node-token".into()),
        k => env.get(k).map(|v| pod_ip(v)),
    })?
    .context("no [gateway] in agent.toml")?;
    ensure!(gw.listen.to_string() == "10.1.2.3:7071", "{}", gw.listen);
    ensure!(gw.advertise.as_deref() == Some("https://10.1.2.3:7071"));
    ensure!(gw.server.starts_with("https://"), "{}", gw.server);
    ensure!(gw.tls.serves_https());
    gw.tls.configs().map_err(|e| anyhow::anyhow!("{e}"))?;
    // Without its TLS table the same pod address is refused.
    let plain = text_here.replace("[gateway.tls]", "[gateway.not_tls]");
    let plain = plain[..plain.find("[gateway.not_tls]").unwrap_or(plain.len())].to_owned();
    let e = polar_node::gateway::GatewayConfig::from_toml_with_env(&plain, |k| match k {
        "POLAR_GATEWAY_NODE_ID" => Some("gpu-node-1".into()),
        k => env.get(k).map(|v| pod_ip(v)),
    })
    .map(|_| ())
    .unwrap_err()
    .to_string();
    ensure!(e.contains("is not a loopback address"), "{e}");
    // Trajectories to shared storage: a ReadWriteMany claim.
    let claim =
        mount_of(pod, agent, "/data/trajectories")?["persistentVolumeClaim"]["claimName"].clone();
    let pvc = find(
        &docs,
        "PersistentVolumeClaim",
        claim.as_str().unwrap_or_default(),
    )?;
    ensure!(pvc["spec"]["accessModes"][0] == "ReadWriteMany");

    // The rollout server: one replica, Recreate, SQLite on a claim.
    let dep = find(&docs, "Deployment", "polar-rollout")?;
    ensure!(dep["spec"]["replicas"] == 1);
    ensure!(dep["spec"]["strategy"]["type"] == "Recreate");
    let pod = &dep["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let args: Vec<&str> = c["args"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let db = args
        .iter()
        .position(|a| *a == "--database")
        .and_then(|i| args.get(i + 1))
        .context("no --database")?;
    ensure!(args.starts_with(&["rollout", "serve"]), "{args:?}");
    // It listens on the pod's address, over HTTPS.
    let listen = args
        .iter()
        .position(|a| *a == "--listen")
        .and_then(|i| args.get(i + 1))
        .context("no --listen")?;
    ensure!(*listen == "$(POD_IP):7070", "{listen}");
    ensure!(pod_env(c)?["POD_IP"] == "fieldRef:status.podIP");
    ensure!(c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS");
    let tls = mount_of(pod, c, "/run/secrets/polar-tls")?;
    ensure!(tls["secret"]["secretName"] == "polar-rollout-tls", "{tls}");
    let data = mount_of(pod, c, "/data")?;
    ensure!(db.starts_with("/data/") && data["persistentVolumeClaim"]["claimName"].is_string());
    ensure!(
        find(&docs, "Service", "polar-rollout")?["spec"]["selector"]
            == dep["spec"]["selector"]["matchLabels"]
    );
    // Tokens come from Secrets that exist.
    for env in c["env"].as_array().into_iter().flatten() {
        let secret = &env["valueFrom"]["secretKeyRef"];
        if secret.is_null() {
            continue;
        }
        let s = find(&docs, "Secret", secret["name"].as_str().unwrap_or_default())?;
        ensure!(
            s["stringData"][secret["key"].as_str().unwrap_or_default()].is_string(),
            "{env}"
        );
    }
    let rollout_toml = find(&docs, "ConfigMap", "polar-rollout-config")?["data"]["rollout.toml"]
        .as_str()
        .context("no rollout.toml")?;
    // As the server starts: the file, then the tokens from the Secrets,
    // mounted where the pod mounts them (here: under a temporary root).
    let secret = |name: &str| -> Result<serde_json::Map<String, Value>> {
        find(&docs, "Secret", name)?["stringData"]
            .as_object()
            .cloned()
            .with_context(|| format!("{name}: no stringData"))
    };
    let (tokens, nodes) = (
        secret("polar-rollout-tokens")?,
        secret("polar-node-tokens")?,
    );
    ensure!(
        mount_of(pod, c, "/run/secrets/polar-nodes")?["secret"]["secretName"]
            == "polar-node-tokens"
    );
    ensure!(
        mount_of(pod, c, "/run/secrets/polar")?["secret"]["secretName"] == "polar-rollout-tokens"
    );
    let start = |replace: bool| -> Result<()> {
        let value = |v: &Value| {
            let v = v.as_str().unwrap_or_default();
            if replace {
                v.replace("change-me", "k8s-test")
            } else {
                v.to_owned()
            }
        };
        let root = tempfile::tempdir()?;
        let mounted = |p: &str| root.path().join(p.trim_start_matches('/'));
        std::fs::create_dir_all(mounted("/run/secrets/polar-nodes"))?;
        std::fs::create_dir_all(mounted("/run/secrets/polar"))?;
        for (k, v) in &nodes {
            std::fs::write(mounted("/run/secrets/polar-nodes").join(k), value(v))?;
        }
        std::fs::write(
            mounted("/run/secrets/polar/gateway-token"),
            value(&tokens["gateway-token"]),
        )?;
        Pki::new()?.mount(
            &mounted("/run/secrets/polar-tls"),
            "polar-rollout",
            "tls",
            0o440,
        )?;
        let text = rollout_toml.replace("\"/run/", &format!("\"{}/run/", root.path().display()));
        let mut rollout = polar_rollout::RolloutConfig::from_toml(&text, None)
            .map_err(|e| anyhow::anyhow!("rollout.toml: {e}"))?;
        rollout
            .finish_tokens([value(&tokens["trainer-token"])], [])
            .map_err(|e| anyhow::anyhow!("rollout tokens: {e}"))?;
        ensure!(rollout.node_tokens.len() == nodes.len());
        // --listen $(POD_IP):7070: HTTPS passes the plain-HTTP rule, the
        // certificate and key load, mutual TLS is on.
        rollout.listen = "10.1.2.3:7070".parse()?;
        let e = |e: polar_spec::KeyError| anyhow::anyhow!("{e}");
        rollout
            .tls
            .check_listen("rollout.listen", rollout.listen)
            .map_err(e)?;
        ensure!(rollout.tls.configs().map_err(e)?.client_certs);
        ensure!(rollout.verify_gateway_as == polar_rollout::config::GatewayName::NodeId);
        Ok(())
    };
    // The shipped placeholders are refused; real tokens start.
    let refused = start(false).unwrap_err().to_string();
    ensure!(refused.contains("this is an example token"), "{refused}");
    start(true)?;
    Ok(())
}
